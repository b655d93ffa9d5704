# braid — see README.md. Every target installs what it needs.
GO      ?= go
BIN     := bin/braid
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)$(if $(findstring -dirty,$(VERSION)),-dirty)
LDFLAGS := -s -w -X braid/internal/app.Version=$(VERSION) -X braid/internal/app.Commit=$(COMMIT)
# Lab tests measure timing and throughput: run packages one at a time so they do not disturb
# each other on a small machine.
TESTFLAGS ?= -count=1 -p 1 -timeout 30m

.PHONY: all build deps demo test bench bench-smoke fuzz lab-down clean

all: build

deps:
	@./scripts/deps.sh

build: deps
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/braid

# The main job on its embedded default: two sites, two uplinks each, every path measured.
demo: build
	$(BIN) lab demo

test: deps
	$(GO) test $(TESTFLAGS) ./...
	@./scripts/check-clean.sh

# Macro benchmarks: every driver on one clean commit, -runs 5, written whole into bench/BENCH.md
# (a header naming the commit, then each driver's section, each naming the commit it ran on),
# then checked by scripts/check-bench.sh. A dirty tree is refused (BENCH_DIRTY=1 runs anyway and
# marks it). Commit bench/BENCH.md alone, on top of the commit it names. About two hours on
# 2 cores: rbpm 50 minutes (90 uploads of 30 s: 30 kernel, 60 through the tunnel), cellular 46
# (42 flows of 60 s over LTE traces; scripts/bench.sh runs it once, not five times).
BENCHES := emulator tunnel dataplane lisp lb proxy rbpm cellular
bench: build
	GO=$(GO) ./scripts/bench.sh $(BENCHES)

# One short run of every benchmark, so that none rots (CI runs it).
bench-smoke: build
	@mkdir -p bench/out/smoke
	$(foreach b,$(BENCHES),$(GO) run ./bench/$(b) -braid $(BIN) -runs 1 -quick -out bench/out/smoke/$(b).md &&) true

# Explore every codec's fuzz target for FUZZTIME each (seeds alone run in 'make test').
FUZZTIME ?= 30s
fuzz: deps
	@./scripts/fuzz.sh $(FUZZTIME)

# Install: the binary, a service unit per daemon role, the man pages (help2man, from each
# command's --help), the example site files and the docs; docs/install.md. DESTDIR stages
# (make deb uses it); site files go to $(SYSCONFDIR)/braid, which is created empty.
PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
MANDIR     ?= $(PREFIX)/share/man
DOCDIR     ?= $(PREFIX)/share/doc/braid
UNITDIR    ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= /etc
UNITS      := $(notdir $(wildcard packaging/systemd/braid-*@.service))
EXAMPLES   := $(wildcard examples/*.toml)
MANOUT      = $(dir $(BIN))man
# The Debian package: braid_VERSION_ARCH.deb, written into DEBOUT.
DEBOUT     ?= bin

.PHONY: install uninstall deb

install: build
	rm -rf $(MANOUT) && ./scripts/man.sh $(BIN) $(MANOUT) $(VERSION)
	install -D -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/braid
	install -d -m 0755 $(DESTDIR)$(UNITDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(DOCDIR)/examples $(DESTDIR)$(SYSCONFDIR)/braid
	for u in $(UNITS); do sed 's|@BINDIR@|$(BINDIR)|g' packaging/systemd/$$u >$(DESTDIR)$(UNITDIR)/$$u && chmod 0644 $(DESTDIR)$(UNITDIR)/$$u || exit 1; done
	for m in $(MANOUT)/*.1; do gzip -9n <$$m >$(DESTDIR)$(MANDIR)/man1/$$(basename $$m).gz && chmod 0644 $(DESTDIR)$(MANDIR)/man1/$$(basename $$m).gz || exit 1; done
	install -m 0644 README.md docs/*.md $(DESTDIR)$(DOCDIR)/
	install -m 0644 $(EXAMPLES) $(DESTDIR)$(DOCDIR)/examples/
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

# Removes what install installed; the site files in $(SYSCONFDIR)/braid stay.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/braid $(addprefix $(DESTDIR)$(UNITDIR)/,$(UNITS))
	rm -f $(DESTDIR)$(MANDIR)/man1/braid.1.gz $(DESTDIR)$(MANDIR)/man1/braid-*.1.gz
	rm -rf $(DESTDIR)$(DOCDIR)
	-rmdir $(DESTDIR)$(SYSCONFDIR)/braid 2>/dev/null
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

# 'make install' into a staging tree with PREFIX=/usr, then dpkg-deb (scripts/deb.sh).
deb:
	rm -rf $(dir $(BIN))deb-root
	$(MAKE) --no-print-directory install DESTDIR=$(abspath $(dir $(BIN))deb-root) PREFIX=/usr BIN=$(BIN) VERSION=$(VERSION) COMMIT=$(COMMIT)
	./scripts/deb.sh $(dir $(BIN))deb-root $(VERSION) $(DEBOUT)

lab-down: build
	$(BIN) lab down

clean:
	rm -rf bin
