// Package federation reproduces the Multipath Cloud Federation paper (`braid lab run
// federation`): two proxied sites over wired and LTE links, the paper's four configurations,
// and a cut link; its lab (StartFed) is shared with bench/proxy and the proxy's tests.
package federation
