// Package amptcp reproduces the A-MPTCP paper (`braid lab run amptcp`): its LISP test bed with
// braid pm placing subflows on RLOC pairs, and the two multihomed LISP sites it builds on
// (`braid lab run lisp`: reachability and RLOC failover).
package amptcp
