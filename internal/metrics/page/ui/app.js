// braid's live status page: polls status.json (the role's /status document) once a second and
// draws it. Charts are plain canvas; no library, no request to any other host.
//
// What is plotted is kept in window.braid.series (key -> [[unix seconds, value], ...]) and
// window.braid.charts (chart id -> its title, unit and lines, each naming a series key), so
// that a test or an operator's console can read the numbers behind every chart.
"use strict";
(() => {
  const POLL_MS = 1000;
  const WINDOW_S = 300; // the charts' time span: five minutes
  const COLORS = ["#3b6fb6", "#d9822b", "#2e9e5b", "#b04a9c", "#c23b3b", "#4aa3b5", "#7a5c3e", "#6b6b6b"];

  const braid = { samples: 0, errors: 0, role: "", now: 0, series: {}, charts: {}, last: null };
  window.braid = braid;

  // ---- series and counter rates ----

  function push(key, t, v) {
    if (v === null || v === undefined || !Number.isFinite(v)) return;
    let s = braid.series[key];
    if (!s) s = braid.series[key] = [];
    s.push([t, v]);
    while (s.length > 0 && s[0][0] < t - WINDOW_S) s.shift();
  }

  const previous = {}; // counter key -> [t, value]
  // perSecond returns the rate of a counter since the last poll, null on the first poll or
  // when the counter went back (a restart).
  function perSecond(key, t, value) {
    const p = previous[key];
    previous[key] = [t, value];
    if (!p || t <= p[0] || value < p[1]) return null;
    return (value - p[1]) / (t - p[0]);
  }

  // ---- DOM helpers (text is always set as text, never as HTML) ----

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "style") Object.assign(e.style, v); // CSSOM: the policy forbids style attributes
      else e.setAttribute(k, v);
    }
    for (const k of kids) {
      if (k === null || k === undefined) continue;
      e.append(k instanceof Node ? k : String(k));
    }
    return e;
  }

  function badge(text) {
    return el("span", { class: "badge " + String(text).replace(/[^a-z-]/g, "") }, text);
  }

  // table builds a table; a cell is text, a Node, or {num: text}.
  function table(headers, rows) {
    const t = el("table", {}, el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))));
    const body = el("tbody");
    for (const r of rows) {
      body.append(el("tr", {}, ...r.map((c) => {
        if (c !== null && typeof c === "object" && !(c instanceof Node)) return el("td", { class: "num" }, c.num);
        return el("td", {}, c);
      })));
    }
    t.append(body);
    return t;
  }

  function fmt(v, digits) {
    if (v === null || v === undefined || !Number.isFinite(v)) return "–";
    return v.toFixed(digits === undefined ? 1 : digits);
  }

  function duration(ns) {
    let s = Math.floor(ns / 1e9);
    if (s < 60) return s + " s";
    let m = Math.floor(s / 60);
    if (m < 60) return m + " min " + (s % 60) + " s";
    const h = Math.floor(m / 60);
    if (h < 48) return h + " h " + (m % 60) + " min";
    return Math.floor(h / 24) + " d " + (h % 24) + " h";
  }

  function bytes(n) {
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n : n.toFixed(1)) + " " + u[i];
  }

  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  const mbit = (bytesPerSecond) => (bytesPerSecond === null ? null : (bytesPerSecond * 8) / 1e6);

  // ---- sections: persistent blocks, each with a table area rebuilt on every poll and a chart
  // area whose canvases stay ----

  const main = () => document.getElementById("main");
  let touched = new Set();

  function section(key, title) {
    touched.add(key);
    let s = document.querySelector(`section[data-key="${CSS.escape(key)}"]`);
    if (!s) {
      s = el("section", { class: "card", "data-key": key }, el("h2"), el("div", { class: "info" }), el("div", { class: "charts" }));
      main().append(s);
    }
    s.querySelector("h2").textContent = title;
    return { info: s.querySelector(".info"), charts: s.querySelector(".charts") };
  }

  function setInfo(sec, ...nodes) {
    sec.info.replaceChildren(...nodes.filter((n) => n !== null && n !== undefined));
  }

  function dropUntouched() {
    for (const s of main().querySelectorAll("section[data-key]")) {
      if (!touched.has(s.dataset.key)) s.remove();
    }
    for (const id of Object.keys(braid.charts)) {
      if (!document.getElementById(id)) delete braid.charts[id];
    }
  }

  // chart declares (or updates) a chart in sec: lines are [{name, key}], series keys in
  // braid.series. opts: {step: true} draws steps (a state), {max: v} fixes the top.
  function chart(sec, id, title, unit, lines, opts) {
    let fig = document.getElementById(id);
    if (!fig) {
      fig = el("figure", { id: id }, el("figcaption"), el("canvas", { class: "chart", "data-chart": id }), el("div", { class: "legend" }));
      sec.charts.append(fig);
    }
    fig.querySelector("figcaption").textContent = title + (unit ? ", " + unit : "");
    const legend = fig.querySelector(".legend");
    legend.replaceChildren(...lines.map((l, i) => el("span", {}, el("i", { style: { background: COLORS[i % COLORS.length] } }), l.name)));
    const def = { title: title, unit: unit, lines: lines, opts: opts || {} };
    braid.charts[id] = def;
    draw(fig.querySelector("canvas"), def);
  }

  function niceCeil(x) {
    if (!(x > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(x)));
    for (const m of [1, 2, 4, 6, 8, 10]) if (m * p >= x * 0.9999) return m * p; // quarters stay round
    return 10 * p;
  }

  function draw(canvas, def) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 420, h = canvas.clientHeight || 180;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const L = 54, R = 10, T = 10, B = 22;
    const now = braid.now, t0 = now - WINDOW_S;
    let top = def.opts.max || 0, points = 0;
    const last = {};
    for (const l of def.lines) {
      const s = braid.series[l.key] || [];
      points += s.length;
      if (s.length) last[l.name] = s[s.length - 1][1];
      if (!def.opts.max) for (const [, v] of s) top = Math.max(top, v);
    }
    top = def.opts.max || niceCeil(top);
    canvas.dataset.points = String(points);
    canvas.dataset.last = JSON.stringify(last);
    const x = (t) => L + ((t - t0) / WINDOW_S) * (w - L - R);
    const y = (v) => T + (1 - Math.min(v, top) / top) * (h - T - B);
    // grid and labels
    ctx.font = "11px system-ui, sans-serif";
    ctx.strokeStyle = "#e3e7eb";
    ctx.fillStyle = "#5f6b76";
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const v = (top * i) / 4, yy = Math.round(y(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(L, yy); ctx.lineTo(w - R, yy); ctx.stroke();
      ctx.fillText(def.opts.step ? (i === 4 ? "up" : i === 0 ? "down" : "") : label(v), L - 6, yy);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (let m = 0; m <= WINDOW_S / 60; m++) {
      const xx = Math.round(x(now - m * 60)) + 0.5;
      ctx.beginPath(); ctx.moveTo(xx, T); ctx.lineTo(xx, h - B); ctx.stroke();
      ctx.fillText(m === 0 ? "now" : "−" + m + " min", Math.min(Math.max(xx, L + 12), w - R - 14), h - B + 5);
    }
    // lines
    def.lines.forEach((l, i) => {
      const s = braid.series[l.key] || [];
      ctx.strokeStyle = COLORS[i % COLORS.length];
      ctx.lineWidth = 1.8;
      ctx.beginPath();
      let prevY = null;
      s.forEach(([t, v], j) => {
        const xx = x(t), yy = y(v);
        if (j === 0) ctx.moveTo(xx, yy);
        else if (def.opts.step) { ctx.lineTo(xx, prevY); ctx.lineTo(xx, yy); }
        else ctx.lineTo(xx, yy);
        prevY = yy;
      });
      ctx.stroke();
      if (s.length > 0) { // the latest value as a dot: visible even while the line is short
        const [t, v] = s[s.length - 1];
        ctx.fillStyle = COLORS[i % COLORS.length];
        ctx.beginPath();
        ctx.arc(x(t), y(v), 2.5, 0, 2 * Math.PI);
        ctx.fill();
      }
    });
    if (points === 0) {
      ctx.fillStyle = "#5f6b76";
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      ctx.fillText("no samples yet", (L + w - R) / 2, (T + h - B) / 2);
    }
  }

  function label(v) {
    if (v === 0) return "0";
    if (v >= 1000) return (v / 1000).toFixed(v >= 10000 ? 0 : 1) + "k";
    if (v >= 10) return v.toFixed(0);
    if (v >= 1) return v.toFixed(1);
    return v.toPrecision(2);
  }

  // ---- the roles ----

  function renderTunnel(st) {
    document.getElementById("summary").textContent =
      `public key ${st.PublicKey} · up ${duration(st.Uptime)} · tunnel MTU ${st.MTU} · ${plural((st.Peers || []).length, "peer")}`;
    for (const p of st.Peers || []) {
      const sec = section("peer/" + p.Name, "Peer " + p.Name);
      const rows = [];
      const lines = { tx: [], rx: [], rtt: [], loss: [], state: [] };
      for (const pa of p.Paths || []) {
        const k = `tunnel/${p.Name}/${pa.ID}`;
        const name = `path ${pa.ID} (${pa.Uplink})`;
        const tx = mbit(perSecond(k + "/txbytes", braid.now, pa.TxDataBytes ?? pa.TxBytes));
        const rx = mbit(perSecond(k + "/rxbytes", braid.now, pa.RxDataBytes ?? pa.RxBytes));
        const up = pa.State === "up";
        push(k + "/tx", braid.now, tx);
        push(k + "/rx", braid.now, rx);
        if (up) {
          push(k + "/rtt", braid.now, pa.RTT / 1e6);
          push(k + "/loss", braid.now, 100 * pa.Loss);
        }
        push(k + "/state", braid.now, up ? 1 : 0);
        for (const m of Object.keys(lines)) lines[m].push({ name: name, key: `${k}/${m}` });
        rows.push([String(pa.ID), pa.Uplink, (pa.Local ? pa.Local + " → " : "→ ") + pa.Remote, badge(pa.State),
          { num: up ? fmt(pa.RTT / 1e6) : "–" }, { num: up ? fmt(100 * pa.Loss, 2) : "–" },
          { num: fmt(tx, 2) }, { num: fmt(rx, 2) },
          { num: pa.RateMeasured ? fmt(pa.Rate / 1e6, 2) : "unmeasured" },
          { num: fmt(pa.Capacity / 1e6, 1) + (pa.CapacityMeasured ? " " + (pa.CapacityPhase || "") : " guess") },
          { num: String(pa.MTU) + (pa.MTUSearching ? "?" : "") }]);
      }
      const session = p.Session
        ? el("span", {}, badge("established"), ` ${p.Cipher || ""} · session age ${duration(p.SessionAge)}`)
        : el("span", {}, badge("none"), " no session");
      setInfo(sec, el("p", {}, "Session ", session, ` · scheduler ${p.Scheduler || "–"} · send queue ${p.SendQueuePackets} packets`),
        table(["path", "uplink", "local → remote", "state", "RTT ms", "loss %", "sent Mbit/s", "received Mbit/s", "peer-measured Mbit/s", "capacity Mbit/s", "MTU"], rows));
      const id = "chart-" + p.Name.replace(/[^A-Za-z0-9_-]/g, "_");
      chart(sec, id + "-tx", "Sent", "Mbit/s", lines.tx);
      chart(sec, id + "-rx", "Received", "Mbit/s", lines.rx);
      chart(sec, id + "-rtt", "Round-trip time", "ms", lines.rtt);
      chart(sec, id + "-loss", "Loss", "%", lines.loss);
      chart(sec, id + "-state", "State", "", lines.state, { step: true, max: 1 });
    }
  }

  function renderMPT(st) {
    document.getElementById("summary").textContent = `mode mpt · up ${duration(st.Uptime)} · IPv${st.IPVersion} · ${plural((st.Paths || []).length, "path")}`;
    const sec = section("mpt", "Paths");
    const rows = [], lines = { tx: [], rx: [], state: [] };
    for (const pa of st.Paths || []) {
      const k = "mpt/" + pa.ID, name = `path ${pa.ID} (${pa.Uplink})`;
      const tx = mbit(perSecond(k + "/txbytes", braid.now, pa.TxBytes));
      const rx = mbit(perSecond(k + "/rxbytes", braid.now, pa.RxBytes));
      push(k + "/tx", braid.now, tx);
      push(k + "/rx", braid.now, rx);
      push(k + "/state", braid.now, pa.State === "up" ? 1 : 0);
      for (const m of Object.keys(lines)) lines[m].push({ name: name, key: `${k}/${m}` });
      rows.push([String(pa.ID), pa.Uplink, pa.Remote, badge(pa.State), { num: String(pa.Weight) }, { num: fmt(tx, 2) }, { num: fmt(rx, 2) }]);
    }
    setInfo(sec, table(["path", "uplink", "remote", "state", "weight", "sent Mbit/s", "received Mbit/s"], rows));
    chart(sec, "chart-mpt-tx", "Sent", "Mbit/s", lines.tx);
    chart(sec, "chart-mpt-rx", "Received", "Mbit/s", lines.rx);
    chart(sec, "chart-mpt-state", "State", "", lines.state, { step: true, max: 1 });
  }

  function renderProxy(st) {
    const conns = st.connections || [];
    let subflows = 0;
    for (const c of conns) subflows += (c.subflows || []).length;
    document.getElementById("summary").textContent =
      `up ${duration(st.uptime_ns || 0)} · ${plural(conns.length, "connection")} · ${plural(subflows, "subflow")}` + (st.draining ? " · draining" : "");
    const tsec = section("proxy/tenants", "Tenants");
    const trows = [];
    for (const t of st.tenants || []) {
      const ready = Object.entries(t.pool_ready || {}).map(([k, v]) => `${k}: ${v}`).join(", ");
      const refused = Object.values(t.refused || {}).reduce((a, b) => a + b, 0);
      trows.push([t.name, { num: String(t.active) }, { num: String(t.out) }, { num: String(t.in) }, { num: bytes(t.bytes_up) }, { num: bytes(t.bytes_down) },
        { num: String(t.failovers) }, { num: String(refused) }, ready || "–"]);
    }
    setInfo(tsec, table(["tenant", "active", "out", "in", "up (finished)", "down (finished)", "failovers", "refused", "pool ready"], trows));
    push("proxy/connections", braid.now, conns.length);
    push("proxy/subflows", braid.now, subflows);
    chart(tsec, "chart-proxy-count", "Live connections and subflows", "", [
      { name: "connections", key: "proxy/connections" }, { name: "subflows", key: "proxy/subflows" }]);
    // throughput of the live connections, by subflow
    const csec = section("proxy/conns", "Connections and their subflows");
    const rows = [], sfLines = [];
    let up = 0, down = 0;
    for (const c of conns) {
      const cu = perSecond(`proxy/c${c.id}/up`, braid.now, c.bytes_up);
      const cd = perSecond(`proxy/c${c.id}/down`, braid.now, c.bytes_down);
      up += cu || 0;
      down += cd || 0;
      rows.push([String(c.id), c.tenant, c.role, c.peer || "–", `${c.src} → ${c.dst}`, duration(c.age_ns), { num: bytes(c.bytes_up) }, { num: bytes(c.bytes_down) },
        { num: fmt(mbit(cu), 2) }, { num: fmt(mbit(cd), 2) }, c.mptcp ? String((c.subflows || []).length) : "TCP"]);
      for (const s of c.subflows || []) {
        const k = `proxy/c${c.id}/${s.local}/${s.remote}`;
        const r = mbit(perSecond(k + "/sent", braid.now, s.bytes_sent));
        push(k + "/rate", braid.now, r);
        push(k + "/rtt", braid.now, s.rtt_ns / 1e6);
        sfLines.push({ name: `#${c.id} ${s.local} → ${s.remote}`, key: k, rtt: s.rtt_ns, rate: r });
        rows.push(["", "", "subflow", "", `${s.local} → ${s.remote}`, "", { num: bytes(s.bytes_sent) }, { num: bytes(s.bytes_received) },
          { num: fmt(r, 2) }, { num: "RTT " + fmt(s.rtt_ns / 1e6) + " ms" }, { num: "retrans " + bytes(s.bytes_retrans) }]);
      }
    }
    push("proxy/up", braid.now, mbit(up));
    push("proxy/down", braid.now, mbit(down));
    setInfo(csec, conns.length ? table(["conn", "tenant", "role", "peer", "src → dst", "age", "up", "down", "up Mbit/s", "down Mbit/s", "subflows"], rows)
      : el("p", { class: "muted" }, "no live connection"));
    chart(csec, "chart-proxy-rate", "Live connections' throughput", "Mbit/s", [{ name: "up", key: "proxy/up" }, { name: "down", key: "proxy/down" }]);
    const top = sfLines.slice(0, COLORS.length);
    chart(csec, "chart-proxy-subflows", "Subflows: sent", "Mbit/s", top.map((s) => ({ name: s.name, key: s.key + "/rate" })));
    chart(csec, "chart-proxy-subflow-rtt", "Subflows: round-trip time", "ms", top.map((s) => ({ name: s.name, key: s.key + "/rtt" })));
  }

  function renderLB(st) {
    if (st.error) {
      document.getElementById("summary").textContent = "status error: " + st.error;
      return;
    }
    const bs = st.backends || [];
    document.getElementById("summary").textContent =
      `mode ${st.mode}${st.aware ? ", MPTCP-aware" : ""} · services ${(st.services || []).join(", ")} · ${plural(bs.length, "backend")}`;
    const sec = section("lb/backends", "Backends");
    let weights = 0, flows = 0;
    const rates = {};
    for (const b of bs) {
      if (b.state === "active") weights += b.weight;
      flows += b.flows;
      rates[b.name] = perSecond(`lb/${b.name}/bytes`, braid.now, b.bytes_total);
    }
    const traffic = Object.values(rates).reduce((a, b) => a + (b || 0), 0);
    const rows = [], lines = { share: [], flows: [], rate: [] };
    for (const b of bs) {
      const share = b.state === "active" && weights > 0 ? (100 * b.weight) / weights : 0;
      const tshare = traffic > 0 && rates[b.name] !== null ? (100 * rates[b.name]) / traffic : null;
      const k = "lb/" + b.name;
      push(k + "/share", braid.now, tshare);
      push(k + "/flows", braid.now, b.flows);
      push(k + "/rate", braid.now, mbit(rates[b.name]));
      for (const m of Object.keys(lines)) lines[m].push({ name: b.name, key: `${k}/${m}` });
      rows.push([b.name, badge(b.state), b.health ? badge(b.health) : "–", { num: String(b.weight) },
        el("span", {}, el("span", { class: "bar", style: { width: `${(share * 1.2).toFixed(0)}px` } }), ` ${fmt(share)} %`),
        { num: tshare === null ? "–" : fmt(tshare) + " %" }, { num: String(b.flows) }, { num: String(b.tokens) }, { num: String(b.conns_total) },
        { num: fmt(mbit(rates[b.name]), 2) }, b.health_error || ""]);
    }
    setInfo(sec, table(["backend", "state", "health", "weight", "share of new connections", "share of traffic", "flows", "tokens", "connections", "Mbit/s", "last health error"], rows));
    chart(sec, "chart-lb-share", "Share of traffic", "%", lines.share, { max: 100 });
    chart(sec, "chart-lb-rate", "Traffic", "Mbit/s", lines.rate);
    chart(sec, "chart-lb-flows", "Flows in the connection table", "", lines.flows);
  }

  // renderGeneric shows any role: its counters' rates as a chart, and each list of objects in
  // its document as a table.
  function renderGeneric(doc) {
    const role = doc.role;
    const body = Object.keys(doc).length === 2 && doc[role] && typeof doc[role] === "object" ? doc[role] : doc;
    document.getElementById("summary").textContent = "";
    const counters = body.counters || body.Counters;
    if (counters && typeof counters === "object") {
      const sec = section(role + "/counters", "Counters");
      const rows = [], active = [];
      for (const k of Object.keys(counters).sort()) {
        const r = perSecond(`${role}/counter/${k}`, braid.now, counters[k]);
        push(`${role}/counter/${k}`, braid.now, r);
        rows.push([k, { num: String(counters[k]) }, { num: fmt(r, 1) }]);
        if ((braid.series[`${role}/counter/${k}`] || []).some(([, v]) => v > 0)) active.push(k);
      }
      setInfo(sec, table(["counter", "total", "per second"], rows));
      chart(sec, "chart-" + role + "-counters", "Counters that moved", "per second",
        active.slice(0, COLORS.length).map((k) => ({ name: k, key: `${role}/counter/${k}` })));
    }
    for (const [k, v] of Object.entries(body)) {
      if (!Array.isArray(v) || v.length === 0 || typeof v[0] !== "object" || v[0] === null) continue;
      const cols = Object.keys(v[0]).filter((c) => v[0][c] === null || typeof v[0][c] !== "object");
      const sec = section(role + "/" + k, k.replace(/_/g, " "));
      setInfo(sec, el("p", {}, `${v.length} entries`), table(cols, v.slice(0, 200).map((r) => cols.map((c) => String(r[c] ?? "")))));
    }
  }

  function render(doc) {
    touched = new Set();
    braid.role = doc.role || "unknown";
    document.getElementById("role").textContent = braid.role;
    document.title = "braid " + braid.role;
    if (doc.role === "tunnel" && doc.tunnel) renderTunnel(doc.tunnel);
    else if (doc.role === "tunnel" && doc.mpt) renderMPT(doc.mpt);
    else if (doc.role === "proxy" && doc.proxy) renderProxy(doc.proxy);
    else if (doc.role === "lb") renderLB(doc);
    else renderGeneric(doc);
    dropUntouched();
    const raw = document.getElementById("raw");
    if (document.getElementById("rawbox").open) raw.textContent = JSON.stringify(doc, null, 2);
  }

  let failedSince = 0;
  async function poll() {
    const conn = document.getElementById("conn");
    try {
      const resp = await fetch("status.json", { cache: "no-store" });
      if (!resp.ok) throw new Error(resp.status + " " + resp.statusText);
      const doc = await resp.json();
      braid.now = Date.now() / 1000;
      braid.last = doc;
      try {
        render(doc);
      } catch (err) { // a document this page does not know how to draw: say so, keep polling
        console.error("braid status page: cannot draw the status document:", err);
        err.message = "cannot draw the status document: " + err.message;
        throw err;
      }
      braid.samples++;
      failedSince = 0;
      conn.textContent = "live · updated " + new Date().toLocaleTimeString();
      conn.className = "conn";
    } catch (err) {
      braid.errors++;
      if (!failedSince) failedSince = Date.now();
      conn.textContent = `no usable answer for ${Math.round((Date.now() - failedSince) / 1000)} s (${err.message}); retrying`;
      conn.className = "conn bad";
    }
    setTimeout(poll, POLL_MS);
  }

  document.getElementById("rawbox").addEventListener("toggle", () => {
    if (braid.last) document.getElementById("raw").textContent = JSON.stringify(braid.last, null, 2);
  });
  window.addEventListener("resize", () => {
    for (const [id, def] of Object.entries(braid.charts)) {
      const c = document.querySelector(`canvas[data-chart="${CSS.escape(id)}"]`);
      if (c) draw(c, def);
    }
  });
  poll();
})();
