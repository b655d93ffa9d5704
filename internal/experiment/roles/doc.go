// Package roles starts braid's roles inside lab hosts for the experiments and the lab tests: a
// tunnel in-process or a pair of braid tunnel processes with their site files, braid proxy
// processes and their status, the LISP sites (map server, xTRs) and braid pm, and MPTCP
// sockets in a host.
package roles
