// Package rbpm reproduces the RBPM paper's scenarios (`braid lab run rbpm`): kernel MPTCP with
// and without braid pm rbpm, and braid tunnel with each scheduler, over paths of unequal rate
// and delay.
package rbpm
