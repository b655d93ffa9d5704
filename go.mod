module braid

go 1.26.8

require (
	github.com/pelletier/go-toml/v2 v2.4.3
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/sys v0.49.0
)

require golang.org/x/crypto v0.58.0
