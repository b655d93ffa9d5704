// Package mptgre reproduces the MPT-GRE paper's measurements (`braid lab run mptgre`): one and
// two paths of 1 Gbit/s, four inner/outer IP combinations, transfer time and CPU.
package mptgre
