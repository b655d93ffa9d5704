// Package natbranch is `braid lab run natbranch`: a branch office behind two NATs (a home router
// and a carrier-grade NAT with random ports) bonded by braid tunnel to a hub that knows only its
// key; the rate against the paths' sum, and a NAT flush during a transfer.
package natbranch
