package xdp

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type backend -type svc_key -type svc -type flow -type conn -type token_key -type token_val -type be_stats -type counters_val lb lb.c -- -I.
