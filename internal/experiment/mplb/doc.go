// Package mplb reproduces the MPLB paper (`braid lab run mplb`): a client, the XDP balancer and
// backends sharing the VIP; download times with an MPTCP-unaware and an MPTCP-aware balancer.
package mplb
