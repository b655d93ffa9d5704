module braid

go 1.26.8

require (
	github.com/pelletier/go-toml/v2 v2.4.3
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/sys v0.49.0
)

require golang.org/x/crypto v0.58.0

require github.com/cilium/ebpf v0.22.0

require (
	github.com/gaissmai/bart v0.30.0
	github.com/mdlayher/genetlink v1.4.0
	github.com/mdlayher/netlink v1.11.2
)

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/mdlayher/socket v0.6.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sync v0.20.0 // indirect
)
