//go:build ignore

// SPDX-License-Identifier: GPL-2.0
/*
 * braid lb: the XDP data plane of an MPTCP-aware layer-4 load balancer.
 *
 * Packets to a virtual service (VIP:port, TCP, IPv4 or IPv6) are sent to one backend:
 *  - a packet of a known flow (connection table) goes where its flow went; the flows whose
 *    packets need nothing but forwarding are also copied into a per-CPU flow cache, so that
 *    their packets are found with no hash-table call (see flow_cache);
 *  - a SYN without MP_JOIN (a first subflow) goes to the backend that Maglev consistent
 *    hashing picks for its 5-tuple, and the flow is pinned in the connection table;
 *  - the first client-to-server MP_CAPABLE carrying the server's key (lengths 20, 22, 24) on a
 *    flow whose MP_CAPABLE SYN this balancer placed teaches the server's token
 *    (SHA-256(key)[0:4] in v1, SHA-1(key)[0:4] in v0), computed here so that a join arriving
 *    microseconds later is already steered; a live token is never overwritten;
 *  - an MP_JOIN SYN goes to the backend that owns its token; a join with an unknown token is
 *    dropped and counted (hashing it would earn an RST that the client never retries);
 *  - a token learned waits in the pending table (an LRU, so that forged handshakes only push
 *    out other pending tokens, oldest first) until a join uses it or it is older than
 *    lb_config.unjoined_ns; the first join moves it to the joined table (a plain hash: nothing
 *    evicts it), within per-prefix and global rate limits;
 *  - a SYN's flow waits in the embryonic table (an LRU of its own) until its next packet, so
 *    that a SYN flood evicts no established flow from the connection table;
 *  - IPv4 fragments and IPv6 packets with extension headers addressed to a VIP are dropped:
 *    TCP needs neither, and neither can be steered (a later fragment has no ports);
 *  - stateless services map (VIP, port) to one backend with no per-connection state, for
 *    backends that announce their own port and refuse joins to the VIP (MPTCP's C flag).
 * Backends share the VIP and answer the client directly; the balancer forwards by rewriting
 * the destination MAC, or by IP-in-IP encapsulation for backends that are not on its segment.
 * Every packet it does not forward is counted by reason.
 */
#include "lb.h"

#define MAX_BACKENDS 256
#define MAX_SERVICES 4
#define MAGLEV_M 65521 /* prime, > 100 x MAX_BACKENDS */
#define NO_BACKEND 0xffffffff

char LICENSE[] SEC("license") = "GPL";

/* Counters, indexes of the counters map (xdp.Counter mirrors them). */
enum {
	C_RX = 0,
	C_PASS_NOT_VIP,
	C_PASS_OTHER,
	C_FWD, /* not counted here: the sum of the backends' packets (count_backend) */
	C_NEW_CONN,
	C_NEW_MIDFLOW,
	C_JOIN_STEERED,
	C_DROP_JOIN_UNKNOWN,
	C_DROP_JOIN_COLLIDED,
	C_TOKEN_LEARNED,
	C_TOKEN_REPEAT,
	C_TOKEN_COLLISION,
	C_TOKEN_FULL,
	C_LEARN_NO_FLOW,
	C_LEARN_LIMITED,
	C_TOKEN_FASTCLOSE,
	C_TOKEN_CLOSING,
	C_MPC_BAD,
	C_OPT_MALFORMED,
	C_DROP_MALFORMED,
	C_DROP_NO_BACKEND,
	C_DROP_ENCAP,
	C_STATELESS_FWD,
	C_DROP_FRAGMENT,
	C_DROP_EXT_HEADER,
	C_TOKEN_PROMOTED,
	C_PROMOTE_LIMITED,
	C_PROMOTE_FULL,
	C_TOKEN_EXPIRED,
	C_CONN_ESTABLISHED,
	C_NUM
};

/* config flags */
#define CFG_AWARE (1 << 0)       /* MPTCP-aware: learn tokens, steer joins */
#define CFG_HASH_ADDRS (1 << 1)  /* hash addresses only (the paper's unaware balancer) */
#define CFG_COLLIDE_DROP (1 << 2) /* a token two backends claim steers no join */
#define CFG_STATELESS (1 << 3)    /* the stateless table has entries */

/* forwarding modes */
#define FWD_MAC 0
#define FWD_IPIP 1

struct lb_config {
	__u32 flags;
	__u32 mode;
	__u32 hash_seed;
	__u32 learn_rate;  /* learnings (and, apart, promotions) per second per /24 or /64; 0: none */
	__u32 learn_burst;
	__u32 global_rate; /* promotions to the joined table per second on this CPU; 0: no limit */
	__u32 global_burst;
	__u32 src4;        /* outer source of IPv4 encapsulation (network order) */
	__u8 src6[16];     /* outer source of IPv6 encapsulation */
	__u8 src_mac[6];   /* source MAC of forwarded frames */
	__u8 pad[2];
	__u64 unjoined_ns; /* a pending token older than this steers no join; 0: no limit */
	__u32 epoch;       /* the flow cache's epoch (see flow_cache): every write of the
			    * configuration bumps it */
	__u32 pad2;
};

/* backend flags */
#define BE_PRESENT (1 << 0)
#define BE_OUTER6 (1 << 1) /* encapsulate in IPv6 */

struct backend {
	__u8 mac[6];
	__u16 flags;
	__u32 ifindex; /* 0: send back out of the receiving interface (XDP_TX) */
	__u32 addr4;   /* encapsulation destination (network order) */
	__u8 addr6[16];
};

struct svc_key {
	__u8 addr[16]; /* IPv4: first 4 bytes, the rest zero */
	__u16 port;    /* network order */
	__u8 family;   /* 4 or 6 */
	__u8 pad;
};

struct svc {
	__u32 id; /* < MAX_SERVICES: row of the Maglev table, tokens are kept per service */
	__u32 flags;
};

struct flow {
	__u8 src[16];
	__u8 dst[16];
	__u16 sport;
	__u16 dport;
	__u8 family;
	__u8 pad[3];
};

/* conn flags */
#define CONN_SYN (1 << 0)     /* the balancer placed this flow's SYN */
#define CONN_MPC (1 << 1)     /* ... and that SYN carried MP_CAPABLE */
#define CONN_V0 (1 << 2)      /* MPTCP version 0 (SHA-1) */
#define CONN_LEARNED (1 << 3) /* the token of its connection is known */
#define CONN_JOIN (1 << 4)    /* a subflow placed by its MP_JOIN token */

struct conn {
	__u32 backend;
	__u32 flags;
	__u32 token;
	__u32 svc;
	__u64 refreshed; /* when the token's activity was last refreshed */
};

struct token_key {
	__u32 svc;
	__u32 token;
};

/* token flags */
#define TOK_V0 (1 << 0)
#define TOK_CLOSING (1 << 1)  /* the client sent DATA_FIN */
#define TOK_COLLIDED (1 << 2) /* another backend claimed the same token */
#define TOK_JOINED (1 << 3)   /* a join used it: it lives in the joined table */

struct token_val {
	__u32 backend;
	__u32 flags;
	__u64 created;
	__u64 active;
};

struct bucket {
	__u64 last;
	__u64 credit; /* in nanosecond-units: one learning costs 1e9 */
};

/* a backend's new connections and steered joins (its packets and bytes are in counters_val) */
struct be_stats {
	__u64 conns;
	__u64 joins;
};

/* The configuration is a global in a data section of its own: the loader makes it a one-element
 * array map (".data.config") that the control plane writes whole, as it wrote the former config
 * map, and the program reads it at a fixed address. A lookup of an array element costs a key on
 * the stack, a bounds check and a NULL test, and the compiler treats it as a call, so values live
 * across it are kept on the stack (docs/lb.md, "The configuration as a global"). */
struct lb_config config SEC(".data.config");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_key);
	__type(value, struct svc);
	__uint(max_entries, MAX_SERVICES);
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_key);
	__type(value, __u32);
	__uint(max_entries, 1024);
} stateless SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, MAX_SERVICES *MAGLEV_M);
} maglev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct backend);
	__uint(max_entries, MAX_BACKENDS);
} backends SEC(".maps");

/* Flows past their SYN: established first subflows and joins. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct flow);
	__type(value, struct conn);
	__uint(max_entries, 1 << 20);
} conns SEC(".maps");

/* Flows seen only by their SYN, and flows placed mid-flow: a SYN flood churns this table and
 * never the connection table. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct flow);
	__type(value, struct conn);
	__uint(max_entries, 1 << 20);
} embryonic SEC(".maps");

/* Joined tokens: a plain hash, not an LRU, so that nothing forged evicts them; entries come
 * only from promotions (rate-limited) and the control plane expires idle ones. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct token_key);
	__type(value, struct token_val);
	__uint(max_entries, 1 << 18);
} tokens SEC(".maps");

/* Tokens learned and not yet joined: an LRU, so that a flood of forged handshakes pushes out
 * the oldest pending tokens instead of filling the table. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct token_key);
	__type(value, struct token_val);
	__uint(max_entries, 1 << 18);
} pending SEC(".maps");

/* The VIP addresses (svc_key with port 0): fragments and extension headers to them are
 * dropped. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_key);
	__type(value, __u32);
	__uint(max_entries, 2 * MAX_SERVICES + 1024);
} vips SEC(".maps");

/* The flow cache: per CPU, a direct-mapped copy of the connection table's entries of flows
 * whose packets need nothing but forwarding (plain TCP flows, and MPTCP subflows whose token
 * is known, as long as their options ask for nothing), so that an established flow's packet
 * is found by an array index and a comparison: no hash-table call, nothing shared written.
 * The program looks here before anything else, the stateless table and the service filter
 * included. An entry is valid while its epoch is the control plane's (lb_config.epoch, so that
 * the configuration's element holds it and no other is read; bumped whenever flows are
 * removed, a stateless entry is added, a backend is set or removed, or the configuration
 * changes) and for CACHE_JIFFIES jiffies (at most a second) after it was
 * filled: then a packet takes the full path again, which marks the connection table's entry
 * used for its LRU and refreshes the activity of the connection's token. */
#define CACHE_SLOTS 4096
#define CACHE_JIFFIES 100

/* A slot carries what forwarding by MAC rewrite needs of its backend, so that a cached packet
 * reads no backend element: SetBackend and RemoveBackend bump the epoch. 64 bytes. */
struct fcache {
	struct flow key;
	__u32 backend;
	__u32 epoch;
	__u32 since;   /* jiffies when filled, low 32 bits (compared by difference) */
	__u32 ifindex; /* the backend's */
	__u8 mac[6];   /* the backend's */
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct fcache);
	__uint(max_entries, CACHE_SLOTS);
} flow_cache SEC(".maps");

/* A bitmap of the services' (address, port, family), by svc_bit: a packet whose bit is clear is
 * for no service, known without a hash lookup (the control plane sets the bits). */
#define SVC_FILTER_WORDS 64
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SVC_FILTER_WORDS);
} svc_filter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct svc_key);
	__type(value, struct bucket);
	__uint(max_entries, 1 << 16);
} learn_limit SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct bucket);
	__uint(max_entries, 1);
} global_limit SEC(".maps");

/* The counters, one per-CPU element holding them all: a packet's two counts (received, and
 * what became of it) read one element pointer and usually one cache line, not two of each.
 * Each backend's packets and bytes are here too, side by side (one line per backend), so that
 * forwarding counts them through the pointer it already holds. */
struct be_count {
	__u64 packets;
	__u64 bytes;
};

struct counters_val {
	__u64 c[C_NUM];
	struct be_count be[MAX_BACKENDS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct counters_val);
	__uint(max_entries, 1);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct be_stats);
	__uint(max_entries, MAX_BACKENDS);
} backend_stats SEC(".maps");

static __always_inline void count(__u32 c)
{
	__u32 zero = 0;
	struct counters_val *v = bpf_map_lookup_elem(&counters, &zero);
	if (v && c < C_NUM)
		v->c[c] += 1;
}

static __always_inline __u32 rotl(__u32 x, int r) { return (x << r) | (x >> (32 - r)); }
static __always_inline __u32 rotr(__u32 x, int r) { return (x >> r) | (x << (32 - r)); }

/* ---- tokens: the first 32 bits of SHA-256 or SHA-1 of the 8-byte key ---- */

static const __u32 k256[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

/* One padded block: the 8-byte key (hi, lo big-endian words), 0x80, zeros, bit length 64.
 * Global subprograms with rolled loops: the verifier checks each once, whatever the number
 * of call sites, and unrolled they would not fit the stack of their callers. */
__noinline __u32 sha256_token(__u32 hi, __u32 lo)
{
	__u32 w[16] = {hi, lo, 0x80000000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64};
	__u32 a = 0x6a09e667, b = 0xbb67ae85, c = 0x3c6ef372, d = 0xa54ff53a;
	__u32 e = 0x510e527f, f = 0x9b05688c, g = 0x1f83d9ab, h = 0x5be0cd19;

	for (__u32 i = 0; i < 64; i++) {
		__u32 wi;
		if (i < 16) {
			wi = w[i & 15];
		} else {
			__u32 w15 = w[(i - 15) & 15], w2 = w[(i - 2) & 15];
			__u32 s0 = rotr(w15, 7) ^ rotr(w15, 18) ^ (w15 >> 3);
			__u32 s1 = rotr(w2, 17) ^ rotr(w2, 19) ^ (w2 >> 10);
			wi = w[i & 15] + s0 + w[(i - 7) & 15] + s1;
			w[i & 15] = wi;
		}
		__u32 S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
		__u32 ch = (e & f) ^ (~e & g);
		__u32 t1 = h + S1 + ch + k256[i & 63] + wi;
		__u32 S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
		__u32 maj = (a & b) ^ (a & c) ^ (b & c);
		h = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + S0 + maj;
	}
	return a + 0x6a09e667;
}

__noinline __u32 sha1_token(__u32 hi, __u32 lo)
{
	__u32 w[16] = {hi, lo, 0x80000000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64};
	__u32 a = 0x67452301, b = 0xefcdab89, c = 0x98badcfe, d = 0x10325476, e = 0xc3d2e1f0;

	for (__u32 i = 0; i < 80; i++) {
		__u32 wi, f, k;
		if (i < 16) {
			wi = w[i & 15];
		} else {
			wi = rotl(w[(i - 3) & 15] ^ w[(i - 8) & 15] ^ w[(i - 14) & 15] ^ w[i & 15], 1);
			w[i & 15] = wi;
		}
		if (i < 20) {
			f = (b & c) | (~b & d);
			k = 0x5a827999;
		} else if (i < 40) {
			f = b ^ c ^ d;
			k = 0x6ed9eba1;
		} else if (i < 60) {
			f = (b & c) | (b & d) | (c & d);
			k = 0x8f1bbcdc;
		} else {
			f = b ^ c ^ d;
			k = 0xca62c1d6;
		}
		__u32 t = rotl(a, 5) + f + e + k + wi;
		e = d;
		d = c;
		c = rotl(b, 30);
		b = a;
		a = t;
	}
	return a + 0x67452301;
}

/* ---- the flow hash (xdp.FlowHash is the same function in Go) ---- */

static __always_inline __u32 mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = rotl(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = rotl(h, 13);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 flow_hash(const struct flow *f, __u32 seed, int addrs_only)
{
	const __u32 *s = (const __u32 *)f->src, *d = (const __u32 *)f->dst;
	__u32 h = seed;
	h = mix(h, s[0]);
	h = mix(h, s[1]);
	h = mix(h, s[2]);
	h = mix(h, s[3]);
	h = mix(h, d[0]);
	h = mix(h, d[1]);
	h = mix(h, d[2]);
	h = mix(h, d[3]);
	if (!addrs_only)
		h = mix(h, (__u32)f->sport | ((__u32)f->dport << 16));
	h = mix(h, f->family);
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* ---- TCP options ---- */

#define OPTBUF 64
/* VOL reads or writes memory on every use: the compiler keeps no copy in a register */
#define VOL(x) (*(volatile typeof(x) *)&(x))

struct optbuf {
	__u8 b[OPTBUF];
	__u32 n; /* bytes of options in b */
};

/* what parse_mptcp found (mp_info.bits) */
#define MP_MALFORMED (1 << 0) /* an option length lies: the list is ignored */
#define MP_CAP (1 << 1)       /* an MP_CAPABLE option */
#define MP_CAP_KEY (1 << 2)   /* ... of a form that carries the receiver's key */
#define MP_CAP_BAD (1 << 3)   /* ... of a length, version or flags no RFC defines */
#define MP_V0 (1 << 4)        /* ... version 0 */
#define MP_JOIN (1 << 5)      /* an MP_JOIN option */
#define MP_JOIN_SYN (1 << 6)  /* ... of the SYN form (length 12) */
#define MP_FASTCLOSE (1 << 7) /* an MP_FASTCLOSE of length 12 */
#define MP_DATA_FIN (1 << 8)  /* a DSS with DATA_FIN */

struct mp_info {
	__u32 bits;
	__u32 key_hi, key_lo; /* MP_CAPABLE receiver's key (MP_CAP_KEY) */
	__u32 fc_hi, fc_lo;   /* MP_FASTCLOSE key */
	__u32 token;          /* MP_JOIN receiver's token (MP_JOIN_SYN) */
	/* scratch of parse_mptcp: offsets + 1 of the first option of each kind, 0 for none.
	 * They live in memory, not registers, so that the verifier does not track each
	 * combination of positions as a state of its own. */
	__u32 cap, join, dss, fc;
	__u32 i, n; /* the walk's position and end, in memory for the same reason */
};

static __always_inline __u32 be32_at(const __u8 *o, __u32 at)
{
	return ((__u32)o[at & (OPTBUF - 1)] << 24) | ((__u32)o[(at + 1) & (OPTBUF - 1)] << 16) |
	       ((__u32)o[(at + 2) & (OPTBUF - 1)] << 8) | (__u32)o[(at + 3) & (OPTBUF - 1)];
}

/* parse_mptcp walks the option list (a global subprogram: verified once, and what it finds
 * reaches the caller as plain values, so the caller's paths do not multiply by option
 * positions). The first MP_CAPABLE, MP_JOIN, DSS and MP_FASTCLOSE count. Returns bits. */
__noinline int parse_mptcp(struct optbuf *ob, struct mp_info *mi)
{
	if (!ob || !mi)
		return 0;
	const __u8 *o = ob->b;

	mi->n = ob->n > 40 ? 40 : ob->n;
	mi->i = 0;
	mi->bits = 0;
	mi->cap = mi->join = mi->dss = mi->fc = 0;
	for (int step = 0; step < 40; step++) {
		__u32 i = VOL(mi->i), n = VOL(mi->n);
		if (i >= n)
			break;
		__u8 kind = o[i & (OPTBUF - 1)];
		if (kind == 0)
			break;
		if (kind == 1) {
			VOL(mi->i) = i + 1;
			continue;
		}
		if (i + 1 >= n) {
			mi->bits = MP_MALFORMED;
			return MP_MALFORMED;
		}
		__u32 len = o[(i + 1) & (OPTBUF - 1)];
		if (len < 2 || i + len > n) {
			mi->bits = MP_MALFORMED;
			return MP_MALFORMED;
		}
		if (kind == 30 && len >= 3) {
			__u8 sub = o[(i + 2) & (OPTBUF - 1)] >> 4;
			if (sub == 0 && !VOL(mi->cap))
				VOL(mi->cap) = i + 1;
			else if (sub == 1 && !VOL(mi->join))
				VOL(mi->join) = i + 1;
			else if (sub == 2 && !VOL(mi->dss))
				VOL(mi->dss) = i + 1;
			else if (sub == 7 && !VOL(mi->fc))
				VOL(mi->fc) = i + 1;
		}
		VOL(mi->i) = i + len;
	}

	__u32 bits = 0;
	if (VOL(mi->cap)) {
		__u32 at = (VOL(mi->cap) - 1) & (OPTBUF - 1);
		__u32 len = o[(at + 1) & (OPTBUF - 1)];
		__u8 ver = o[(at + 2) & (OPTBUF - 1)] & 0x0f;
		__u8 fl = len >= 4 ? o[(at + 3) & (OPTBUF - 1)] : 0;
		bits |= MP_CAP;
		if (ver == 0)
			bits |= MP_V0;
		if (ver > 1 || len < 4 || (fl & 0x1f) != 0x01 || (fl & 0x40))
			bits |= MP_CAP_BAD;
		else if (len == 20 || (ver == 1 && (len == 22 || len == 24))) {
			bits |= MP_CAP_KEY;
			mi->key_hi = be32_at(o, at + 12);
			mi->key_lo = be32_at(o, at + 16);
		} else if (!(len == 4 && ver == 1) && len != 12)
			bits |= MP_CAP_BAD;
	}
	if (VOL(mi->join)) {
		__u32 at = (VOL(mi->join) - 1) & (OPTBUF - 1);
		bits |= MP_JOIN;
		if (o[(at + 1) & (OPTBUF - 1)] == 12) {
			bits |= MP_JOIN_SYN;
			mi->token = be32_at(o, at + 4);
		}
	}
	if (VOL(mi->fc)) {
		__u32 at = (VOL(mi->fc) - 1) & (OPTBUF - 1);
		if (o[(at + 1) & (OPTBUF - 1)] == 12) {
			bits |= MP_FASTCLOSE;
			mi->fc_hi = be32_at(o, at + 4);
			mi->fc_lo = be32_at(o, at + 8);
		}
	}
	if (VOL(mi->dss)) {
		__u32 at = (VOL(mi->dss) - 1) & (OPTBUF - 1);
		if (o[(at + 1) & (OPTBUF - 1)] >= 4 && (o[(at + 3) & (OPTBUF - 1)] & 0x10))
			bits |= MP_DATA_FIN;
	}
	mi->bits = bits;
	return bits;
}

static __always_inline __u32 token_of(__u32 hi, __u32 lo, int v0)
{
	return v0 ? sha1_token(hi, lo) : sha256_token(hi, lo);
}

/* take spends one learning from a bucket refilled at rate per second up to burst. */
static __always_inline int take(struct bucket *b, __u64 now, __u32 rate, __u32 burst)
{
	__u64 cap = (__u64)(burst ? burst : 1) * 1000000000ULL;
	__u64 elapsed = now - b->last;
	if (now < b->last || elapsed > 10000000000ULL)
		elapsed = 10000000000ULL; /* rate <= 1e6 (config), so no overflow */
	__u64 credit = b->credit + elapsed * rate;
	if (credit > cap)
		credit = cap;
	b->last = now;
	if (credit < 1000000000ULL) {
		b->credit = credit;
		return 0;
	}
	b->credit = credit - 1000000000ULL;
	return 1;
}

/* LIMIT_LEARN and LIMIT_PROMOTE: the two uses of a prefix's buckets (svc_key.pad). */
#define LIMIT_LEARN 0
#define LIMIT_PROMOTE 1

/* prefix_allowed spends one from the bucket of f's source /24 (IPv4) or /64 (IPv6): one
 * attacker's prefix, however many addresses it spoofs inside it, shares one budget. */
static __always_inline int prefix_allowed(const struct lb_config *cfg, const struct flow *f, __u64 now, __u8 kind)
{
	if (!cfg->learn_rate)
		return 1;
	struct svc_key k = {};
	if (f->family == 4)
		__builtin_memcpy(k.addr, f->src, 3);
	else
		__builtin_memcpy(k.addr, f->src, 8);
	k.family = f->family;
	k.pad = kind;
	struct bucket *b = bpf_map_lookup_elem(&learn_limit, &k);
	if (!b) {
		struct bucket nb = {.last = now, .credit = (__u64)cfg->learn_burst * 1000000000ULL};
		bpf_map_update_elem(&learn_limit, &k, &nb, BPF_ANY);
		b = bpf_map_lookup_elem(&learn_limit, &k);
		if (!b)
			return 0;
	}
	return take(b, now, cfg->learn_rate, cfg->learn_burst);
}

/* promote_allowed: a join may move its token to the joined table. */
static __always_inline int promote_allowed(const struct lb_config *cfg, const struct flow *f, __u64 now)
{
	if (!prefix_allowed(cfg, f, now, LIMIT_PROMOTE))
		return 0;
	if (cfg->global_rate) {
		__u32 zero = 0;
		struct bucket *b = bpf_map_lookup_elem(&global_limit, &zero);
		if (!b)
			return 0;
		if (b->last == 0) {
			b->last = now;
			b->credit = (__u64)cfg->global_burst * 1000000000ULL;
		}
		if (!take(b, now, cfg->global_rate, cfg->global_burst))
			return 0;
	}
	return 1;
}

static __always_inline int expired(const struct lb_config *cfg, const struct token_val *v, __u64 now)
{
	return cfg->unjoined_ns && now - v->created > cfg->unjoined_ns;
}

/* find_token looks in the joined table, then in the pending one (*in_pending set), where an
 * expired token counts as absent. */
static __always_inline struct token_val *find_token(const struct lb_config *cfg, const struct token_key *k,
						    __u64 now, int *in_pending)
{
	*in_pending = 0;
	struct token_val *v = bpf_map_lookup_elem(&tokens, k);
	if (v)
		return v;
	v = bpf_map_lookup_elem(&pending, k);
	if (!v || expired(cfg, v, now))
		return 0;
	*in_pending = 1;
	return v;
}

/* learn records the server's token of the connection whose first subflow is c, as pending. */
static __always_inline void learn(const struct lb_config *cfg, struct conn *c, const struct flow *f,
				  const struct mp_info *mi, __u64 now)
{
	if (!(c->flags & CONN_SYN) || !(c->flags & CONN_MPC)) {
		count(C_LEARN_NO_FLOW);
		return;
	}
	if (c->flags & CONN_LEARNED)
		return;
	if (!prefix_allowed(cfg, f, now, LIMIT_LEARN)) {
		count(C_LEARN_LIMITED);
		return;
	}
	int v0 = mi->bits & MP_V0;
	__u32 token = token_of(mi->key_hi, mi->key_lo, v0);
	struct token_key k = {.svc = c->svc, .token = token};
	c->flags |= CONN_LEARNED | (v0 ? CONN_V0 : 0);
	c->token = token;
	c->refreshed = now;
	int in_pending;
	struct token_val *old = find_token(cfg, &k, now, &in_pending);
	if (old) {
		if (old->backend == c->backend) {
			count(C_TOKEN_REPEAT);
			return;
		}
		count(C_TOKEN_COLLISION);
		if (cfg->flags & CFG_COLLIDE_DROP)
			old->flags |= TOK_COLLIDED;
		return;
	}
	struct token_val v = {.backend = c->backend, .flags = v0 ? TOK_V0 : 0, .created = now, .active = now};
	/* an LRU: when full, the least recently used pending tokens make room */
	if (bpf_map_update_elem(&pending, &k, &v, BPF_ANY)) {
		count(C_TOKEN_FULL);
		return;
	}
	count(C_TOKEN_LEARNED);
}

/* forget removes a token from the table it is in. */
static __always_inline void forget(const struct token_key *k, int in_pending)
{
	if (in_pending)
		bpf_map_delete_elem(&pending, k);
	else
		bpf_map_delete_elem(&tokens, k);
}

/* ---- forwarding ---- */

static __always_inline __u16 csum_fold(__u32 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* copy_mac: a MAC address in one 4-byte and one 2-byte move (a memcpy of a byte array is six
 * byte moves on BPF); unaligned packet and map value access is allowed where it is efficient. The
 * baseline program uses it too, so that the comparison is of the programs' other work. */
static __always_inline void copy_mac(__u8 *dst, const __u8 *src)
{
	__u32 a = *(const __u32 *)src;
	__u16 b = *(const __u16 *)(src + 4);
	*(__u32 *)dst = a;
	*(__u16 *)(dst + 4) = b;
}

/* count_backend: one more packet of len bytes forwarded to backend idx. The forwarded count
 * (C_FWD) is the sum of these over the backends, summed by the control plane: a forwarded
 * packet makes one count, not two. */
static __always_inline void count_backend(struct counters_val *cv, __u32 idx, __u64 len)
{
	if (cv && idx < MAX_BACKENDS) {
		cv->be[idx].packets++;
		cv->be[idx].bytes += len;
	}
}

/* forward_mac: forwards the frame to a backend on this segment by rewriting its MACs, out of
 * ifindex (0: the receiving interface). */
static __always_inline int forward_mac(struct xdp_md *ctx, struct counters_val *cv, const struct lb_config *cfg,
				       __u32 idx, const __u8 *mac, __u32 ifindex)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_DROP;
	copy_mac(eth->h_dest, mac);
	copy_mac(eth->h_source, cfg->src_mac);
	count_backend(cv, idx, end - data);
	if (ifindex)
		return bpf_redirect(ifindex, 0);
	return XDP_TX;
}

static __always_inline int forward(struct xdp_md *ctx, struct counters_val *cv, const struct lb_config *cfg,
				   __u32 idx, const struct backend *be, int inner6)
{
	if (!be)
		be = bpf_map_lookup_elem(&backends, &idx);
	if (!be || !(be->flags & BE_PRESENT)) {
		count(C_DROP_NO_BACKEND);
		return XDP_DROP;
	}
	if (cfg->mode == FWD_IPIP) {
		__u32 inner_len = ctx->data_end - ctx->data - sizeof(struct ethhdr);
		int outer6 = be->flags & BE_OUTER6;
		int delta = outer6 ? (int)sizeof(struct ipv6hdr) : (int)sizeof(struct iphdr);
		if (bpf_xdp_adjust_head(ctx, -delta)) {
			count(C_DROP_ENCAP);
			return XDP_DROP;
		}
		void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
		struct ethhdr *eth = data;
		if (outer6) {
			struct ipv6hdr *ip6 = (void *)(eth + 1);
			if ((void *)(ip6 + 1) > end) {
				count(C_DROP_ENCAP);
				return XDP_DROP;
			}
			eth->h_proto = bswap16(ETH_P_IPV6);
			ip6->vtc[0] = 0x60;
			ip6->vtc[1] = ip6->vtc[2] = ip6->vtc[3] = 0;
			ip6->payload_len = bswap16((__u16)inner_len);
			ip6->nexthdr = inner6 ? IPPROTO_IPV6 : IPPROTO_IPIP;
			ip6->hop_limit = 64;
			__builtin_memcpy(ip6->saddr, cfg->src6, 16);
			__builtin_memcpy(ip6->daddr, be->addr6, 16);
		} else {
			struct iphdr *ip = (void *)(eth + 1);
			if ((void *)(ip + 1) > end) {
				count(C_DROP_ENCAP);
				return XDP_DROP;
			}
			eth->h_proto = bswap16(ETH_P_IP);
			ip->ihl_version = 0x45;
			ip->tos = 0;
			ip->tot_len = bswap16((__u16)(inner_len + sizeof(struct iphdr)));
			ip->id = 0;
			ip->frag_off = 0;
			ip->ttl = 64;
			ip->protocol = inner6 ? IPPROTO_IPV6 : IPPROTO_IPIP;
			ip->check = 0;
			ip->saddr = cfg->src4;
			ip->daddr = be->addr4;
			const __u16 *w = (const __u16 *)ip;
			__u32 s = 0;
			for (int i = 0; i < 10; i++)
				s += w[i];
			ip->check = csum_fold(s);
		}
		copy_mac(eth->h_dest, be->mac);
		copy_mac(eth->h_source, cfg->src_mac);
		/* counted at the frame's length as it arrived */
		count_backend(cv, idx, inner_len + sizeof(struct ethhdr));
		if (be->ifindex)
			return bpf_redirect(be->ifindex, 0);
		return XDP_TX;
	}
	return forward_mac(ctx, cv, cfg, idx, be->mac, be->ifindex);
}

/* is_vip: is addr (4 or 16 bytes at a, by family) the address of a service? */
static __always_inline int is_vip(const void *a, __u8 family)
{
	struct svc_key k = {};
	__builtin_memcpy(k.addr, a, family == 4 ? 4 : 16);
	k.family = family;
	return bpf_map_lookup_elem(&vips, &k) != 0;
}

/* IPv6 extension headers (RFC 8200 and the IANA list), AH included. */
static __always_inline int ipv6_ext(__u8 nh)
{
	return nh == 0 || nh == 43 || nh == 44 || nh == 60 || nh == 51 || nh == 135 || nh == 139 ||
	       nh == 140 || nh == 253 || nh == 254;
}

/* quick_options reads in place the two option lists that an MPTCP data packet carries on a
 * known flow: timestamps alone (NOP, NOP, TS: no MPTCP option), and a DSS last, after the
 * timestamps or alone. It sets *bits as parse_mptcp would (MP_DATA_FIN or nothing) and returns
 * 1; for any other list it returns 0 and the parser reads it. */
static __always_inline int quick_options(const __u8 *o, const void *end, int optlen, __u32 *bits)
{
	const __u32 nop_nop_ts = 0x0a080101; /* 01 01 08 0a, read as a little-endian word */
	if ((void *)(o + 4) > end)
		return 0;
	if (optlen == 12) {
		if ((void *)(o + 12) > end || *(const __u32 *)o != nop_nop_ts)
			return 0;
		*bits = 0;
		return 1;
	}
	int at;
	if (*(const __u32 *)o == nop_nop_ts)
		at = 12;
	else if (o[0] == 30)
		at = 0;
	else
		return 0;
	if (optlen < at + 4 || (void *)(o + at + 4) > end)
		return 0;
	const __u8 *d = o + at;
	/* a DSS (subtype 2) that ends the list exactly */
	if (d[0] != 30 || d[1] != optlen - at || (d[2] >> 4) != 2)
		return 0;
	*bits = (d[3] & 0x10) ? MP_DATA_FIN : 0;
	return 1;
}

/* svc_bit: the bit of (address, port, family) in svc_filter (xdp.svcBit computes the same):
 * the address's 32-bit words (as in memory, little-endian), port and family folded, then
 * multiplied by a 32-bit constant whose high 12 bits index the 4096-bit map. */
static __always_inline __u32 svc_bit(const struct flow *f)
{
	const __u32 *d = (const __u32 *)f->dst;
	__u32 x = d[0] ^ d[1] ^ d[2] ^ d[3] ^ (__u32)f->dport ^ ((__u32)f->family << 16);
	return (x * 0x9e3779b1) >> 20;
}

/* maybe_service: can f's destination be a service? 0 when its bit is clear. */
static __always_inline int maybe_service(const struct flow *f)
{
	__u32 bit = svc_bit(f);
	__u32 w = bit >> 6;
	__u64 *v = bpf_map_lookup_elem(&svc_filter, &w);
	return v && (*v >> (bit & 63)) & 1;
}

/* A flow's slot in the flow cache (any spread will do: the key is compared whole):
 * addr_mix(source words folded, destination words folded), then cache_slot(that, ports). The
 * parse computes the first from the header words it has just read, not from f. */
static __always_inline __u32 addr_mix(__u32 src, __u32 dst)
{
	return (src * 0x9e3779b1) ^ (dst * 0x85ebca6b);
}

static __always_inline __u32 cache_slot(__u32 mix, __u32 ports)
{
	__u32 x = mix ^ ports * 0xc2b2ae35;
	return (x ^ (x >> 16)) & (CACHE_SLOTS - 1);
}

static __always_inline int same_flow(const struct flow *a, const struct flow *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && x[4] == y[4];
}

/* find_service: the service of f's destination (VIP, port), or 0. */
static __always_inline struct svc *find_service(const struct flow *f)
{
	struct svc_key sk = {};
	__builtin_memcpy(sk.addr, f->dst, 16);
	sk.port = f->dport;
	sk.family = f->family;
	return bpf_map_lookup_elem(&services, &sk);
}

static __always_inline __u32 maglev_pick(const struct lb_config *cfg, const struct svc *s, const struct flow *f)
{
	__u32 h = flow_hash(f, cfg->hash_seed, cfg->flags & CFG_HASH_ADDRS);
	__u32 idx = s->id * MAGLEV_M + h % MAGLEV_M;
	__u32 *b = bpf_map_lookup_elem(&maglev, &idx);
	return b ? *b : NO_BACKEND;
}

SEC("xdp")
int braid_lb(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	/* written whole below, in five 8-byte words */
	struct flow f __attribute__((aligned(8)));
	struct tcphdr *tcp;
	__u32 l4, mix;
	__u8 fam;
	/* the counters element, looked up once: every packet counts its arrival and most their
	 * forwarding */
	__u32 zero = 0;
	struct counters_val *cv = bpf_map_lookup_elem(&counters, &zero);

	if (cv)
		cv->c[C_RX] += 1;
	if ((void *)(eth + 1) > end) {
		count(C_PASS_OTHER);
		return XDP_PASS;
	}
	if (eth->h_proto == bswap16(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end || (ip->ihl_version >> 4) != 4 || (ip->ihl_version & 0xf) < 5) {
			count(C_PASS_OTHER);
			return XDP_PASS;
		}
		if (ip->frag_off & bswap16(0x3fff)) {
			/* a fragment (MF set or an offset): to a VIP, dropped */
			if (is_vip(&ip->daddr, 4)) {
				count(C_DROP_FRAGMENT);
				return XDP_DROP;
			}
			count(C_PASS_OTHER);
			return XDP_PASS;
		}
		if (ip->protocol != IPPROTO_TCP) {
			count(C_PASS_OTHER);
			return XDP_PASS;
		}
		l4 = sizeof(struct ethhdr) + (ip->ihl_version & 0xf) * 4;
		__u32 sa = ip->saddr, da = ip->daddr;
		__u64 w = sa, z = 0;
		__builtin_memcpy(f.src, &w, 8);
		__builtin_memcpy(f.src + 8, &z, 8);
		w = da;
		__builtin_memcpy(f.dst, &w, 8);
		__builtin_memcpy(f.dst + 8, &z, 8);
		mix = addr_mix(sa, da);
		fam = 4;
	} else if (eth->h_proto == bswap16(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end) {
			count(C_PASS_OTHER);
			return XDP_PASS;
		}
		if (ip6->nexthdr != IPPROTO_TCP) {
			/* extension headers (the fragment header among them) to a VIP: dropped */
			if (ipv6_ext(ip6->nexthdr) && is_vip(ip6->daddr, 6)) {
				count(C_DROP_EXT_HEADER);
				return XDP_DROP;
			}
			count(C_PASS_OTHER);
			return XDP_PASS;
		}
		l4 = sizeof(struct ethhdr) + sizeof(struct ipv6hdr);
		const __u32 *a = (const __u32 *)ip6->saddr, *b = (const __u32 *)ip6->daddr;
		__u64 w = a[0] | (__u64)a[1] << 32;
		__builtin_memcpy(f.src, &w, 8);
		w = a[2] | (__u64)a[3] << 32;
		__builtin_memcpy(f.src + 8, &w, 8);
		w = b[0] | (__u64)b[1] << 32;
		__builtin_memcpy(f.dst, &w, 8);
		w = b[2] | (__u64)b[3] << 32;
		__builtin_memcpy(f.dst + 8, &w, 8);
		mix = addr_mix(a[0] ^ a[1] ^ a[2] ^ a[3], b[0] ^ b[1] ^ b[2] ^ b[3]);
		fam = 6;
	} else {
		count(C_PASS_OTHER);
		return XDP_PASS;
	}
	l4 &= 0x7f;
	tcp = data + l4;
	if ((void *)(tcp + 1) > end) {
		count(C_PASS_OTHER);
		return XDP_PASS;
	}
	/* the ports and the family in one 8-byte store, the addresses in 8-byte stores above: the
	 * flow cache's slot and comparison then read f back in words each contained in one store,
	 * which the CPU forwards (a 4-byte read of two 2-byte stores stalled the packet for about
	 * 6 ns: docs/lb.md) */
	__u32 ports;
	__builtin_memcpy(&ports, &tcp->source, 4);
	__u64 w4 = ports | (__u64)fam << 32;
	__builtin_memcpy(&f.sport, &w4, 8);
	__u8 tflags = tcp->flags;
	int doff = (tcp->doff_res >> 4) * 4;

	const struct lb_config *cfg = &config;

	int aware = cfg->flags & CFG_AWARE;
	int syn = (tflags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
	int optlen = doff - 20;
	int wellformed = doff >= 20 && (void *)tcp + doff <= end;
	/* An established flow whose packets need nothing but forwarding is found first, in this
	 * CPU's flow cache: an array index and a comparison. Its service was known when it was
	 * placed, and whatever could change that (a service deleted or made stateless, flows
	 * dropped, the configuration) bumps the epoch, so neither the stateless table nor the
	 * service filter is read for it. */
	__u32 slot = cache_slot(mix, ports);
	struct fcache *fc = bpf_map_lookup_elem(&flow_cache, &slot);
	/* the epoch as this packet found it: a slot filled below carries it, so that a slot filled
	 * from state read before a bump is stale at once */
	__u32 epv = cfg->epoch;
	if (fc && !syn && wellformed && fc->epoch == epv && same_flow(&fc->key, &f) &&
	    (__u32)bpf_jiffies64() - fc->since < CACHE_JIFFIES) {
		/* a cached plain flow: forwarded if its options ask for nothing */
		__u32 qb = 1;
		if (!aware || optlen == 0 || (optlen <= 40 && quick_options((const void *)(tcp + 1), end, optlen, &qb) && !qb)) {
			if (cfg->mode != FWD_IPIP) {
				/* the slot carries the backend's MAC and interface: no backend read */
				return forward_mac(ctx, cv, cfg, fc->backend, fc->mac, fc->ifindex);
			}
			struct backend *cb = bpf_map_lookup_elem(&backends, &fc->backend);
			if (cb && (cb->flags & BE_PRESENT))
				return forward(ctx, cv, cfg, fc->backend, cb, f.family == 6);
		}
	}

	if (cfg->flags & CFG_STATELESS) {
		struct svc_key sk = {};
		__builtin_memcpy(sk.addr, f.dst, 16);
		sk.port = f.dport;
		sk.family = f.family;
		__u32 *sl = bpf_map_lookup_elem(&stateless, &sk);
		if (sl) {
			count(C_STATELESS_FWD);
			return forward(ctx, cv, cfg, *sl, 0, f.family == 6);
		}
	}
	/* Any other established flow is found by its 5-tuple alone: one hash lookup. Its service
	 * was known when it was placed, and DeleteService removes the flows of a service it
	 * deletes, so the service table is read only for packets of no known flow. Traffic for no
	 * service is told apart first by a bitmap (no hash lookup at all). */
	if (!maybe_service(&f)) {
		count(C_PASS_NOT_VIP);
		return XDP_PASS;
	}
	struct conn *c = bpf_map_lookup_elem(&conns, &f);
	struct svc *s = 0;
	if (!c) {
		s = find_service(&f);
		if (!s) {
			count(C_PASS_NOT_VIP);
			return XDP_PASS;
		}
	}
	if (!wellformed) {
		count(C_DROP_MALFORMED);
		return XDP_DROP;
	}

	/* Options are read only where they can change what happens: for a new flow (its SYN's
	 * MP_CAPABLE, a join's token) and, on a known flow, by an MPTCP-aware balancer. */
	struct mp_info mi = {};
	int quick = 0;
	if (optlen > 0 && optlen <= 40 && c && !syn && aware)
		quick = quick_options((const void *)(tcp + 1), end, optlen, &mi.bits);
	if (optlen > 0 && optlen <= 40 && (aware || !c) && !quick) {
		struct optbuf ob;
		__builtin_memset(&ob, 0, sizeof(ob));
		/* 1 + ((n - 1) & 63) is n (1..40 here), written so that the verifier sees a size
		 * of 1 to 64 whatever copy of the length the compiler passes */
		__u32 olen = 1 + (((__u32)optlen - 1) & (OPTBUF - 1));
		if (bpf_xdp_load_bytes(ctx, l4 + 20, ob.b, olen)) {
			count(C_DROP_MALFORMED);
			return XDP_DROP;
		}
		ob.n = optlen;
		parse_mptcp(&ob, &mi);
		if (mi.bits & MP_MALFORMED) {
			count(C_OPT_MALFORMED);
			mi.bits = 0;
		}
	}
	__u32 bits = mi.bits;

	/* the clock is read only by what needs it: a packet of an established plain TCP flow
	 * does not */
	__u64 now = 0;
	if (!c) {
		now = bpf_ktime_get_coarse_ns();
		c = bpf_map_lookup_elem(&embryonic, &f);
		/* the packet after a SYN: the flow is established (as far as a balancer that never
		 * sees the server's answers can tell) and moves to the connection table */
		if (c && !syn && (c->flags & (CONN_SYN | CONN_JOIN))) {
			bpf_map_update_elem(&conns, &f, c, BPF_ANY);
			bpf_map_delete_elem(&embryonic, &f);
			c = bpf_map_lookup_elem(&conns, &f);
			count(C_CONN_ESTABLISHED);
		}
	} else if (aware && (bits || (c->flags & (CONN_LEARNED | CONN_JOIN)))) {
		now = bpf_ktime_get_coarse_ns();
	}
	struct backend *be = 0;
	if (c) {
		be = bpf_map_lookup_elem(&backends, &c->backend);
		if (!be || !(be->flags & BE_PRESENT)) {
			/* its backend was removed: place the flow again */
			bpf_map_delete_elem(&conns, &f);
			bpf_map_delete_elem(&embryonic, &f);
			c = 0;
		}
	}
	if (c) {
		if (aware) {
			if ((bits & MP_CAP) && !syn) {
				if (bits & MP_CAP_BAD)
					count(C_MPC_BAD);
				else if (bits & MP_CAP_KEY)
					learn(cfg, c, &f, &mi, now);
			}
			if (c->flags & (CONN_LEARNED | CONN_JOIN)) {
				struct token_key tk = {.svc = c->svc, .token = c->token};
				int inp;
				if ((bits & MP_FASTCLOSE) && (c->flags & CONN_LEARNED)) {
					/* the client's MP_FASTCLOSE carries the server's key */
					__u32 t = token_of(mi.fc_hi, mi.fc_lo, c->flags & CONN_V0);
					struct token_key fk = {.svc = c->svc, .token = t};
					struct token_val *tv = find_token(cfg, &fk, now, &inp);
					if (tv && tv->backend == c->backend) {
						forget(&fk, inp);
						count(C_TOKEN_FASTCLOSE);
					}
				} else if (bits & MP_DATA_FIN) {
					struct token_val *tv = find_token(cfg, &tk, now, &inp);
					if (tv && tv->backend == c->backend && !(tv->flags & TOK_CLOSING)) {
						tv->flags |= TOK_CLOSING;
						tv->active = now;
						count(C_TOKEN_CLOSING);
					}
				} else if (now - c->refreshed > 1000000000ULL) {
					c->refreshed = now;
					struct token_val *tv = find_token(cfg, &tk, now, &inp);
					if (tv && tv->backend == c->backend)
						tv->active = now;
				}
			}
		}
		/* into the flow cache if its next packets need nothing but forwarding (a flow
		 * whose token may still be learned does not) */
		if (fc && !syn &&
		    (!aware || !(c->flags & CONN_MPC) || (c->flags & (CONN_LEARNED | CONN_JOIN)))) {
			__builtin_memcpy(&fc->key, &f, sizeof(f));
			fc->backend = c->backend;
			fc->epoch = epv;
			fc->since = (__u32)bpf_jiffies64();
			if (be) {
				fc->ifindex = be->ifindex;
				copy_mac(fc->mac, be->mac);
			}
		}
		return forward(ctx, cv, cfg, c->backend, be, f.family == 6);
	}

	if (!s) {
		/* a known flow whose backend was removed */
		s = find_service(&f);
		if (!s) {
			count(C_PASS_NOT_VIP);
			return XDP_PASS;
		}
		now = bpf_ktime_get_coarse_ns();
	}
	struct conn nc = {.svc = s->id, .refreshed = now};
	if (syn && aware && (bits & MP_JOIN)) {
		if (!(bits & MP_JOIN_SYN)) {
			count(C_DROP_JOIN_UNKNOWN);
			return XDP_DROP;
		}
		struct token_key tk = {.svc = s->id, .token = mi.token};
		struct token_val *tv = bpf_map_lookup_elem(&tokens, &tk);
		if (tv) {
			if (tv->flags & TOK_COLLIDED) {
				count(C_DROP_JOIN_COLLIDED);
				return XDP_DROP;
			}
			nc.backend = tv->backend;
			tv->active = now;
		} else {
			tv = bpf_map_lookup_elem(&pending, &tk);
			if (tv && expired(cfg, tv, now)) {
				bpf_map_delete_elem(&pending, &tk);
				count(C_TOKEN_EXPIRED);
				tv = 0;
			}
			if (!tv) {
				count(C_DROP_JOIN_UNKNOWN);
				return XDP_DROP;
			}
			if (tv->flags & TOK_COLLIDED) {
				count(C_DROP_JOIN_COLLIDED);
				return XDP_DROP;
			}
			/* the first join: the token moves to the joined table, where no flood evicts it */
			nc.backend = tv->backend;
			tv->active = now;
			if (!promote_allowed(cfg, &f, now)) {
				count(C_PROMOTE_LIMITED);
			} else if (bpf_map_update_elem(&tokens, &tk, tv, BPF_NOEXIST)) {
				count(C_PROMOTE_FULL);
			} else {
				bpf_map_delete_elem(&pending, &tk);
				tv = bpf_map_lookup_elem(&tokens, &tk);
				if (tv)
					tv->flags |= TOK_JOINED;
				count(C_TOKEN_PROMOTED);
			}
		}
		nc.flags = CONN_JOIN;
		nc.token = tk.token;
		count(C_JOIN_STEERED);
		struct be_stats *st = bpf_map_lookup_elem(&backend_stats, &nc.backend);
		if (st)
			st->joins++;
	} else {
		nc.backend = maglev_pick(cfg, s, &f);
		if (nc.backend >= MAX_BACKENDS) {
			count(C_DROP_NO_BACKEND);
			return XDP_DROP;
		}
		if (syn) {
			nc.flags = CONN_SYN;
			if ((bits & MP_CAP) && !(bits & MP_CAP_BAD))
				nc.flags |= CONN_MPC;
			count(C_NEW_CONN);
			struct be_stats *st = bpf_map_lookup_elem(&backend_stats, &nc.backend);
			if (st)
				st->conns++;
		} else {
			count(C_NEW_MIDFLOW);
			if (aware && (bits & MP_CAP_KEY))
				count(C_LEARN_NO_FLOW);
		}
	}
	/* new flows start embryonic; a flow placed mid-flow stays there (Maglev places it
	 * again the same way if a flood pushes it out, unless the table changed) */
	bpf_map_update_elem(&embryonic, &f, &nc, BPF_ANY);
	return forward(ctx, cv, cfg, nc.backend, 0, f.family == 6);
}

/* ---- programs for benchmarks and labs (not part of the balancer) ---- */

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} sink_count SEC(".maps");

/* braid_baseline is plain XDP_TX forwarding (the MAC addresses swapped): the baseline that the
 * balancer's forwarding rate is compared with. */
SEC("xdp")
int braid_baseline(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u8 tmp[8] __attribute__((aligned(4)));
	if ((void *)(eth + 1) > end)
		return XDP_DROP;
	copy_mac(tmp, eth->h_dest);
	copy_mac(eth->h_dest, eth->h_source);
	copy_mac(eth->h_source, tmp);
	return XDP_TX;
}

/* braid_sink counts and drops what arrives: on the far end of a veth pair, it receives the
 * frames that XDP_TX or a redirect sends there (a veth peer needs an XDP program for that). */
SEC("xdp")
int braid_sink(struct xdp_md *ctx)
{
	__u32 zero = 0;
	__u64 *v = bpf_map_lookup_elem(&sink_count, &zero);
	if (v)
		*v += 1;
	return XDP_DROP;
}

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} decap_count SEC(".maps");

/* braid_decap strips the outer header of IP-in-IP packets (IPv4 or IPv6 inside IPv4 or IPv6,
 * an outer IPv4 header without options) and passes the inner packet to the stack: a backend
 * of the ipip mode whose kernel has no IP-in-IP tunnel device runs it on its interface. */
SEC("xdp")
int braid_decap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ethhdr copy;
	int hlen;
	__u8 inner;

	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	if (eth->h_proto == bswap16(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end || ip->ihl_version != 0x45 || (ip->frag_off & bswap16(0x3fff)))
			return XDP_PASS;
		inner = ip->protocol;
		hlen = sizeof(struct iphdr);
	} else if (eth->h_proto == bswap16(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end)
			return XDP_PASS;
		inner = ip6->nexthdr;
		hlen = sizeof(struct ipv6hdr);
	} else {
		return XDP_PASS;
	}
	if (inner != IPPROTO_IPIP && inner != IPPROTO_IPV6)
		return XDP_PASS;
	__builtin_memcpy(&copy, eth, sizeof(copy));
	copy.h_proto = bswap16(inner == IPPROTO_IPIP ? ETH_P_IP : ETH_P_IPV6);
	if (bpf_xdp_adjust_head(ctx, hlen))
		return XDP_DROP;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_DROP;
	__builtin_memcpy(eth, &copy, sizeof(copy));
	__u32 zero = 0;
	__u64 *v = bpf_map_lookup_elem(&decap_count, &zero);
	if (v)
		*v += 1;
	return XDP_PASS;
}
