// Tessera's console. Every request goes through /ui/api (the API itself, with the session's
// token); every string from the API is written with textContent (el() below), never as HTML.
import { drawHeatmap, layoutPool } from "./heatmap.js";

const PAGE = document.body.dataset.page;
const main = document.getElementById("main");
let session = null;

// ---- DOM and formatting ---------------------------------------------------------------------

export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function clear(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
  return node;
}

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function row(cells) {
  return el("tr", {}, cells.map((c) => el("td", {}, c)));
}

export function age(timestamp) {
  if (!timestamp) return "";
  const seconds = Math.max(0, (Date.now() - Date.parse(timestamp)) / 1000);
  if (seconds < 120) return `${Math.floor(seconds)}s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 172800) return `${Math.floor(seconds / 3600)}h`;
  return `${Math.floor(seconds / 86400)}d`;
}

function localTime(timestamp) {
  return timestamp ? new Date(timestamp).toLocaleString() : "";
}

function money(amount, currency) {
  const value = Number(amount || 0);
  return `${value.toFixed(value !== 0 && Math.abs(value) < 0.01 ? 6 : 2)} ${currency || ""}`.trim();
}

// JSON to YAML, enough for Kubernetes objects (strings quoted when YAML would misread them).
export function toYaml(value, indent = "") {
  const scalar = (v) => {
    if (v === null || v === undefined) return "null";
    if (typeof v !== "string") return String(v);
    if (v === "" || /^[\s\-?:,[\]{}#&*!|>'"%@`]|[:#]\s|\s$|^(true|false|null|yes|no|~|[-+]?[\d.]+(e[-+]?\d+)?)$/i.test(v) || v.includes("\n"))
      return JSON.stringify(v);
    return v;
  };
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    return value.map((item) => {
      if (item && typeof item === "object" && Object.keys(item).length) {
        const inner = toYaml(item, indent + "  ");
        return `${indent}- ${inner.slice(indent.length + 2)}`;
      }
      return `${indent}- ${item && typeof item === "object" ? (Array.isArray(item) ? "[]" : "{}") : scalar(item)}`;
    }).join("\n");
  }
  if (value && typeof value === "object") {
    const keys = Object.keys(value);
    if (!keys.length) return "{}";
    return keys.map((key) => {
      const v = value[key];
      if (v && typeof v === "object" && (Array.isArray(v) ? v.length : Object.keys(v).length))
        return `${indent}${scalar(key)}:\n${toYaml(v, Array.isArray(v) ? indent : indent + "  ")}`;
      return `${indent}${scalar(key)}: ${v && typeof v === "object" ? (Array.isArray(v) ? "[]" : "{}") : scalar(v)}`;
    }).join("\n");
  }
  return indent + scalar(value);
}

// ---- the API, through the console's gateway -------------------------------------------------

export async function api(path, options = {}) {
  const headers = { "X-Tessera-CSRF": session ? session.csrf : "", ...(options.headers || {}) };
  const response = await fetch(`/ui/api${path}`, { ...options, headers, credentials: "same-origin" });
  if (response.status === 401) {
    window.location.assign("/ui/login");
    throw new Error("the session has ended");
  }
  return response;
}

class ApiError extends Error {
  constructor(status) {
    super(status.message || `HTTP ${status.code}`);
    this.status = status;
  }
}

async function json(path, options) {
  const response = await api(path, options);
  const body = await response.json().catch(() => ({ message: `HTTP ${response.status}` }));
  if (!response.ok) throw new ApiError({ code: response.status, ...body });
  return body;
}

function statusBox(error) {
  const status = error.status || { message: String(error.message || error) };
  const causes = (status.details && status.details.causes) || [];
  return el("div", { class: "error", role: "alert" }, status.message,
    causes.length ? el("ul", { class: "causes" }, causes.map((c) =>
      el("li", {}, el("code", {}, c.field || ""), c.field ? ": " : "", c.message || c.reason || ""))) : null);
}

// A watch (or a followed log) as a stream of lines, read with fetch (which sends the CSRF header).
async function streamLines(path, onLine, signal) {
  const response = await api(path, { signal });
  if (!response.ok) throw new ApiError({ code: response.status, ...(await response.json().catch(() => ({}))) });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let newline;
    while ((newline = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, newline);
      buffer = buffer.slice(newline + 1);
      onLine(line);
    }
  }
  if (buffer) onLine(buffer);
}

// A list read in pages of `limit`, then kept current by a watch from its resourceVersion.
export async function listAndWatch(path, { limit = 500, onPage, onEvent, signal, query = "" }) {
  let resourceVersion = "";
  let cont = "";
  do {
    const params = new URLSearchParams(query);
    params.set("limit", String(limit));
    if (cont) params.set("continue", cont);
    const list = await json(`${path}?${params}`, { signal });
    onPage(list.items || []);
    resourceVersion = list.metadata.resourceVersion;
    cont = list.metadata.continue || "";
  } while (cont);
  for (;;) {
    const params = new URLSearchParams(query);
    params.set("watch", "1");
    params.set("allowWatchBookmarks", "true");
    params.set("resourceVersion", resourceVersion);
    let expired = false;
    try {
      await streamLines(`${path}?${params}`, (line) => {
        if (!line.trim()) return;
        const event = JSON.parse(line);
        if (event.type === "ERROR") { expired = true; return; }
        if (event.object && event.object.metadata && event.object.metadata.resourceVersion)
          resourceVersion = event.object.metadata.resourceVersion;
        if (event.type !== "BOOKMARK") onEvent(event);
      }, signal);
    } catch (e) {
      if (e.status && e.status.code === 403) throw e;
      await new Promise((r) => setTimeout(r, 2000)); // a dropped stream: watch again
    }
    if (signal && signal.aborted) return;
    if (expired) return listAndWatch(path, { limit, onPage: (items) => onPage(items, true), onEvent, signal, query });
  }
}

// ---- pages: login ---------------------------------------------------------------------------

async function loginPage() {
  const input = el("input", { type: "password", name: "token", autocomplete: "off", placeholder: "tsr_…", id: "token" });
  const message = el("div", { class: "error", role: "alert" });
  const form = el("form", { class: "login" },
    el("h1", {}, "Log in to Tessera"),
    el("label", { for: "token" }, "Token (tessera token create …)"), input,
    el("button", { class: "primary", type: "submit" }, "Log in"), message);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const response = await fetch("/ui/login", {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ token: input.value }),
    });
    input.value = "";
    if (response.ok) { window.location.assign("/ui"); return; }
    const body = await response.json().catch(() => ({}));
    message.textContent = body.message || `HTTP ${response.status}`;
  });
  clear(main, form);
  input.focus();
}

// ---- pages: pods ----------------------------------------------------------------------------

function gpuSlice(pod) {
  const parts = [];
  for (const c of (pod.spec && pod.spec.containers) || []) {
    const limits = (c.resources && c.resources.limits) || {};
    if (limits["nvidia.com/gpu"]) parts.push(`${limits["nvidia.com/gpu"]} GPU`);
    if (limits["tessera.io/gpu-memory"]) parts.push(`${limits["tessera.io/gpu-memory"]} VRAM`);
    if (limits["tessera.io/gpu-core"]) parts.push(`${limits["tessera.io/gpu-core"]}% SM`);
  }
  return parts.join(" ");
}

function podPhase(pod) {
  if (pod.metadata.deletionTimestamp) return "Terminating";
  const waiting = ((pod.status && pod.status.containerStatuses) || [])
    .map((s) => s.state && s.state.waiting && s.state.waiting.reason).find(Boolean);
  return waiting || (pod.status && pod.status.reason) || (pod.status && pod.status.phase) || "Pending";
}

const PAGE_SIZE = 500;

async function podsPage() {
  const pods = new Map();
  const keys = new Map(); // uid -> the sort key, made once
  const put = (pod) => {
    pods.set(pod.metadata.uid, pod);
    if (!keys.has(pod.metadata.uid)) keys.set(pod.metadata.uid, `${pod.metadata.namespace}\u0000${pod.metadata.name}`);
  };
  let page = 0;
  let filter = "";
  const counter = el("span", { class: "muted", id: "pod-count" });
  const pageLabel = el("span", { id: "pod-page" });
  const tbody = el("tbody", { id: "pod-rows" });
  const search = el("input", { type: "search", placeholder: "filter by name", id: "pod-filter" });
  const error = el("div");
  let scheduled = false;
  let sorted = null;
  const render = () => {
    scheduled = false;
    const began = performance.now();
    lastRender = began;
    if (!sorted) {
      // By namespace, then name (plain code-point order on a key made once per pod: a
      // locale-aware sort of 10,000 pods would hold the page at every change).
      sorted = [];
      for (const [uid, p] of pods) if (!filter || p.metadata.name.includes(filter)) sorted.push([keys.get(uid), p]);
      sorted.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
      sorted = sorted.map((pair) => pair[1]);
    }
    const pages = Math.max(1, Math.ceil(sorted.length / PAGE_SIZE));
    page = Math.min(page, pages - 1);
    counter.textContent = `${sorted.length} pods`;
    pageLabel.textContent = `page ${page + 1} of ${pages}`;
    const rows = sorted.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE).map((pod) => {
      const m = pod.metadata;
      const phase = podPhase(pod);
      return el("tr", { "data-name": m.name },
        el("td", {}, m.namespace),
        el("td", {}, el("a", { href: `/ui/pods/${encodeURIComponent(m.namespace)}/${encodeURIComponent(m.name)}` }, m.name)),
        el("td", { class: `phase-${phase}` }, phase),
        el("td", {}, gpuSlice(pod)),
        el("td", {}, (pod.spec && pod.spec.nodeName) || ""),
        el("td", { title: localTime(m.creationTimestamp) }, age(m.creationTimestamp)));
    });
    tbody.replaceChildren(...rows);
    const took = performance.now() - began;
    tbody.dataset.longestRenderMs = String(Math.max(Number(tbody.dataset.longestRenderMs || 0), took).toFixed(1));
  };
  // Changes are drawn at most every 250 ms however fast the watch streams.
  let lastRender = 0;
  const changed = (resorted = true) => {
    if (resorted) sorted = null;
    if (scheduled) return;
    scheduled = true;
    const wait = Math.max(0, 250 - (performance.now() - lastRender));
    window.setTimeout(() => requestAnimationFrame(render), wait);
  };
  search.addEventListener("input", () => { filter = search.value; page = 0; changed(); });
  const prev = el("button", { type: "button", id: "pod-prev", onclick: () => { page = Math.max(0, page - 1); changed(false); } }, "‹ Previous");
  const next = el("button", { type: "button", id: "pod-next", onclick: () => { page += 1; changed(false); } }, "Next ›");
  clear(main, el("h1", {}, "Pods"),
    el("div", { class: "toolbar" }, search, counter, prev, pageLabel, next,
      el("a", { href: "/ui/create" }, "Create…"), el("span", { class: "muted", id: "live" }, "")),
    error,
    el("table", {}, el("thead", {}, el("tr", {}, ["Namespace", "Name", "Status", "GPU slice", "Node", "Age"].map((h) => el("th", {}, h)))), tbody));
  const live = document.getElementById("live");
  window.setInterval(() => changed(false), 10000); // ages move on
  try {
    await listAndWatch("/api/v1/pods", {
      limit: PAGE_SIZE,
      onPage: (items, relist) => {
        if (relist) { pods.clear(); keys.clear(); }
        for (const pod of items) put(pod);
        changed();
        live.textContent = "● live";
      },
      onEvent: (event) => {
        const pod = event.object;
        if (event.type === "DELETED") { pods.delete(pod.metadata.uid); keys.delete(pod.metadata.uid); }
        else put(pod);
        changed();
      },
    });
  } catch (e) {
    live.textContent = "";
    clear(error, statusBox(e));
  }
}

// ---- pages: one pod ------------------------------------------------------------------------

function pathParts() {
  const parts = window.location.pathname.split("/").slice(3).map(decodeURIComponent);
  return { namespace: parts[0] || "", name: parts[1] || "" };
}

async function podPage() {
  const { namespace, name } = pathParts();
  const base = `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(name)}`;
  const summary = el("div", { id: "pod-summary" });
  const conditions = el("div");
  const events = el("div");
  const yaml = el("pre", { id: "pod-yaml" });
  const logs = el("pre", { id: "pod-logs" });
  const actions = el("div", { id: "pod-actions" });
  const error = el("div", { id: "pod-error" });
  clear(main, el("h1", {}, "Pod ", el("span", { id: "pod-name" }, `${namespace}/${name}`)), error, summary,
    actions, el("h2", {}, "Conditions"), conditions, el("h2", {}, "Events"), events,
    el("h2", {}, "Logs (following)"), logs, el("h2", {}, "YAML"), yaml);
  let pod;
  try {
    pod = await json(base);
  } catch (e) {
    clear(error, statusBox(e));
    return;
  }
  const show = (p) => {
    pod = p;
    const s = p.status || {};
    clear(summary, el("div", { class: "cards" },
      [["Status", podPhase(p)], ["Node", (p.spec && p.spec.nodeName) || "—"], ["GPU slice", gpuSlice(p) || "—"],
        ["QoS", s.qosClass || "—"], ["Age", age(p.metadata.creationTimestamp)]]
        .map(([k, v]) => el("div", { class: "card" }, el("div", { class: "muted" }, k), el("div", { class: "value" }, v)))),
      el("h2", {}, "Labels"),
      table(["Key", "Value"], Object.entries(p.metadata.labels || {}).map(([k, v]) => row([k, v]))),
      el("h2", {}, "Annotations"),
      table(["Key", "Value"], Object.entries(p.metadata.annotations || {}).map(([k, v]) => row([k, v]))));
    clear(conditions, table(["Type", "Status", "Reason", "Message", "Last transition"],
      (s.conditions || []).map((c) => row([c.type, c.status, c.reason || "", c.message || "", localTime(c.lastTransitionTime)]))));
    yaml.textContent = toYaml(p);
  };
  show(pod);
  const message = el("span", { id: "action-message" });
  const act = async (label, fn) => {
    message.textContent = `${label}…`;
    try { await fn(); message.textContent = `${label}: done`; } catch (e) { clear(message, statusBox(e)); }
  };
  const cpu = el("input", { placeholder: "cpu, e.g. 500m", size: 12, id: "resize-cpu" });
  const memory = el("input", { placeholder: "memory, e.g. 1Gi", size: 12, id: "resize-memory" });
  clear(actions, el("div", { class: "toolbar" },
    el("button", { type: "button", class: "danger", id: "delete", onclick: () => act("Delete", async () => {
      if (!window.confirm(`Delete pod ${namespace}/${name}?`)) return;
      await json(base, { method: "DELETE" });
    }) }, "Delete"),
    el("button", { type: "button", id: "evict", onclick: () => act("Evict", () => json(`${base}/eviction`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ apiVersion: "policy/v1", kind: "Eviction", metadata: { name, namespace } }),
    })) }, "Evict"),
    cpu, memory,
    el("button", { type: "button", id: "resize", onclick: () => act("Resize", async () => {
      const requests = {};
      if (cpu.value) requests.cpu = cpu.value;
      if (memory.value) requests.memory = memory.value;
      const containers = pod.spec.containers.map((c) => ({ name: c.name, resources: { requests } }));
      show(await json(`${base}/resize`, {
        method: "PATCH", headers: { "Content-Type": "application/strategic-merge-patch+json" },
        body: JSON.stringify({ spec: { containers } }),
      }));
    }) }, "Resize"), message));
  // Events, then the pod kept current by a watch on it alone.
  json(`/api/v1/namespaces/${encodeURIComponent(namespace)}/events?fieldSelector=${encodeURIComponent(`involvedObject.name=${name}`)}`)
    .then((list) => clear(events, table(["Type", "Reason", "Message", "Count", "Last seen"],
      (list.items || []).map((e) => row([e.type || "", e.reason || "", e.message || "", e.count || 1, localTime(e.lastTimestamp || e.eventTime)])))))
    .catch((e) => clear(events, statusBox(e)));
  listAndWatch(`/api/v1/namespaces/${encodeURIComponent(namespace)}/pods`, {
    query: `fieldSelector=${encodeURIComponent(`metadata.name=${name}`)}`,
    onPage: (items) => { if (items.length) show(items[0]); },
    onEvent: (event) => {
      if (event.type === "DELETED") { summary.prepend(el("p", { class: "error", id: "deleted" }, "This pod was deleted.")); return; }
      show(event.object);
    },
  }).catch(() => {});
  followLogs(base, logs);
}

async function followLogs(base, pre) {
  const MAX_LINES = 5000;
  for (let attempt = 0; attempt < 30; attempt++) {
    try {
      await streamLines(`${base}/log?follow=true&tailLines=1000&timestamps=false`, (line) => {
        pre.append(document.createTextNode(line + "\n"));
        while (pre.childNodes.length > MAX_LINES) pre.firstChild.remove();
        pre.scrollTop = pre.scrollHeight;
      });
      return;
    } catch (e) {
      // A pod that has not started has no log yet: try again shortly.
      pre.textContent = (e.status && e.status.message) || String(e);
      await new Promise((r) => setTimeout(r, 2000));
      pre.textContent = "";
    }
  }
}

// ---- pages: create --------------------------------------------------------------------------

async function createPage() {
  const namespaces = await json("/api/v1/namespaces").catch(() => ({ items: [] }));
  const select = el("select", { id: "create-namespace" },
    (namespaces.items || []).map((n) => el("option", { value: n.metadata.name }, n.metadata.name)));
  const text = el("textarea", { id: "create-yaml", spellcheck: "false" });
  text.value = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hello\nspec:\n  containers:\n  - name: main\n    image: busybox\n    command: [\"sh\", \"-c\", \"echo hello; sleep 60\"]\n    resources:\n      requests: {cpu: 100m, memory: 64Mi}\n";
  const result = el("div", { id: "create-result" });
  const send = async (dryRun) => {
    clear(result, el("span", { class: "muted" }, "sending…"));
    const ns = encodeURIComponent(select.value);
    const query = dryRun ? "?dryRun=All&fieldValidation=Strict" : "?fieldValidation=Strict";
    try {
      const pod = await json(`/api/v1/namespaces/${ns}/pods${query}`, {
        method: "POST", headers: { "Content-Type": "application/yaml" }, body: text.value,
      });
      const href = `/ui/pods/${encodeURIComponent(pod.metadata.namespace)}/${encodeURIComponent(pod.metadata.name)}`;
      clear(result, el("p", { class: "ok" }, dryRun ? "Valid: the API accepts it (nothing was created). " : "Created ",
        dryRun ? null : el("a", { href }, `${pod.metadata.namespace}/${pod.metadata.name}`)));
    } catch (e) {
      clear(result, statusBox(e));
    }
  };
  clear(main, el("h1", {}, "Create a pod from YAML"),
    el("div", { class: "toolbar" }, el("label", {}, "Namespace ", select),
      el("button", { type: "button", id: "dry-run", onclick: () => send(true) }, "Validate (dry run)"),
      el("button", { type: "button", class: "primary", id: "create", onclick: () => send(false) }, "Create")),
    result, text);
}

// ---- charts ---------------------------------------------------------------------------------

const PALETTE = ["#2453d6", "#e07b00", "#1b9e77", "#c4291c", "#7b4fc9", "#6b7280", "#d6a400", "#0f8fa8"];

// Stacked bars on a <canvas>: buckets (x) by series (colour).
function barChart(title, buckets, series, values, currency) {
  const width = 720, height = 240, pad = 44;
  const canvas = el("canvas", { width, height, "aria-label": title });
  const ctx = canvas.getContext("2d");
  const totals = buckets.map((_, i) => series.reduce((sum, s) => sum + (values[s][i] || 0), 0));
  const max = Math.max(...totals, 1e-9);
  ctx.font = "11px system-ui";
  ctx.fillStyle = "#667085";
  ctx.fillText(`${max.toFixed(4)} ${currency}`, 2, 12);
  ctx.fillText("0", 2, height - pad + 4);
  const bw = Math.min(48, (width - pad - 10) / Math.max(buckets.length, 1));
  buckets.forEach((label, i) => {
    let y = height - pad;
    series.forEach((s, k) => {
      const h = ((values[s][i] || 0) / max) * (height - pad - 20);
      ctx.fillStyle = PALETTE[k % PALETTE.length];
      ctx.fillRect(pad + i * bw + 1, y - h, Math.max(bw - 2, 1), h);
      y -= h;
    });
    if (buckets.length <= 31 || i % Math.ceil(buckets.length / 24) === 0) {
      ctx.fillStyle = "#667085";
      ctx.save();
      ctx.translate(pad + i * bw + bw / 2, height - pad + 6);
      ctx.rotate(Math.PI / 4);
      ctx.fillText(label, 0, 0);
      ctx.restore();
    }
  });
  const legend = el("div", { class: "legend" }, series.map((s, k) => {
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = PALETTE[k % PALETTE.length];
    return el("span", {}, swatch, s);
  }));
  return el("div", {}, el("h2", {}, title), canvas, legend);
}

function chartOf(list, key, labelOf) {
  const buckets = [...new Set(list.items.map((r) => r.start))].sort();
  const series = [...new Set(list.items.map((r) => r[key] || "—"))].sort();
  const values = Object.fromEntries(series.map((s) => [s, buckets.map(() => 0)]));
  for (const r of list.items) values[r[key] || "—"][buckets.indexOf(r.start)] += Number(r.amount);
  return { buckets: buckets.map(labelOf), series, values };
}

// ---- pages: usage ---------------------------------------------------------------------------

// Spend per value of one grouping (a UsageList grouped by `key`), largest first: the table
// #by-<key>, each row's value and amount in data-<key> and data-amount ("—": none).
function spendTable(list, key, heading, currency) {
  const sums = new Map();
  for (const r of list.items) sums.set(r[key] || "—", (sums.get(r[key] || "—") || 0) + Number(r.amount));
  return el("table", { id: `by-${key}` }, el("thead", {}, el("tr", {}, el("th", {}, heading), el("th", {}, "Spend"))),
    el("tbody", {}, [...sums.entries()].sort((a, b) => b[1] - a[1]).slice(0, 200).map(([value, amount]) =>
      el("tr", { [`data-${key}`]: value, "data-amount": amount }, el("td", {}, value), el("td", {}, money(amount, currency))))));
}

async function usagePage() {
  const out = el("div");
  clear(main, el("h1", {}, "Usage and spend"), out);
  const hour = (t) => new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  const day = (t) => new Date(t).toLocaleDateString();
  const since = (days) => new Date(Date.now() - days * 86400000).toISOString().replace(/\.\d+Z$/, "Z");
  const base = "/apis/billing.tessera.io/v1/usage";
  try {
    const [byResource, byDay, byPod, byQos, byWorkload] = await Promise.all([
      json(`${base}?granularity=hour&groupBy=resource&from=${since(1)}`),
      json(`${base}?granularity=day&groupBy=resource&from=${since(30)}`),
      json(`${base}?granularity=day&groupBy=pod&from=${since(1)}`),
      json(`${base}?granularity=hour&groupBy=qos&from=${since(1)}`),
      json(`${base}?granularity=day&groupBy=workload&from=${since(1)}`),
    ]);
    const currency = byResource.currency;
    const totalToday = Number((byPod.total && byPod.total.amount) || 0);
    const charts = [
      ["Spend per hour by resource (24 h)", chartOf(byResource, "resource", hour)],
      ["Spend per day by resource (30 days)", chartOf(byDay, "resource", day)],
      ["BestEffort against default, per hour (24 h)", chartOf(byQos, "qos", hour)],
    ].map(([title, c]) => barChart(title, c.buckets, c.series, c.values, currency));
    clear(out, el("div", { class: "cards" }, el("div", { class: "card" }, el("div", { class: "muted" }, "Last 24 hours"),
      el("div", { class: "value", id: "spend-today" }, money(totalToday, currency)))),
    el("div", { class: "grid2" }, charts),
    el("h2", {}, "By workload (24 h)"), spendTable(byWorkload, "workload", "Workload", currency),
    el("h2", {}, "By pod (24 h)"), spendTable(byPod, "pod", "Pod", currency));
  } catch (e) {
    clear(out, statusBox(e));
  }
  const statements = el("div", { id: "statements" });
  const commitments = el("div", { id: "commitments" });
  main.append(el("h2", {}, "Statements"), statements, el("h2", {}, "Commitment plans"), commitments);
  if (!session.tenant) {
    statements.textContent = "Statements are per tenant: log in with a tenant's token.";
    return;
  }
  try {
    const ns = encodeURIComponent(session.tenant);
    const [list, plans] = await Promise.all([
      json(`/apis/billing.tessera.io/v1/namespaces/${ns}/statements`),
      json(`/apis/billing.tessera.io/v1/namespaces/${ns}/commitments`),
    ]);
    const sumOf = (s, kind) => (s.status.lines || []).filter((l) => l.kind === kind).reduce((a, l) => a + Number(l.amount), 0);
    const items = (list.items || []).slice().sort((a, b) => (a.status.day < b.status.day ? 1 : -1));
    clear(statements, items.length ? table(["Day (UTC)", "State", "Usage at list price", "Commitment", "Commitment saved", "Total"], items.map((s) =>
      row([s.status.day, s.status.phase, money(sumOf(s, "usage"), s.status.currency), money(sumOf(s, "commitment"), s.status.currency),
        money(sumOf(s, "savings"), s.status.currency), money(s.status.total, s.status.currency)]))) :
      el("p", { class: "muted" }, "No statements yet."));
    clear(commitments, (plans.items || []).length ? table(["Plan", "Per day", "This month: list price", "Owed", "Saved"], plans.items.map((p) => {
      const month = p.status.thisMonth || {};
      return row([p.metadata.name, p.spec.amountPerDay, month.listPrice || "", month.owed || "", month.savings || ""]);
    })) : el("p", { class: "muted" }, "No commitment plan."));
  } catch (e) {
    clear(statements, statusBox(e));
  }
}

// ---- pages: callbacks -----------------------------------------------------------------------

async function callbacksPage() {
  const out = el("div");
  clear(main, el("h1", {}, "Callbacks"), out);
  try {
    const list = await json("/apis/tessera.io/v1/callbacks");
    clear(out, table(["Namespace", "Name", "URL", "Events", "Age"], (list.items || []).map((c) => row([
      c.metadata.namespace,
      el("a", { href: `/ui/callbacks/${encodeURIComponent(c.metadata.namespace)}/${encodeURIComponent(c.metadata.name)}` }, c.metadata.name),
      (c.spec && c.spec.url) || "", ((c.spec && c.spec.events) || []).join(", "), age(c.metadata.creationTimestamp)]))));
  } catch (e) {
    clear(out, statusBox(e));
  }
}

async function callbackPage() {
  const { namespace, name } = pathParts();
  const base = `/apis/tessera.io/v1/namespaces/${encodeURIComponent(namespace)}/callbacks/${encodeURIComponent(name)}`;
  const out = el("div");
  clear(main, el("h1", {}, "Callback ", `${namespace}/${name}`), out);
  try {
    const [callback, deliveries] = await Promise.all([json(base), json(`${base}/deliveries`)]);
    clear(out, el("pre", {}, toYaml(callback.spec || {})), el("h2", {}, "Deliveries"),
      table(["Event", "Subject", "Phase", "Attempts", "Last error", "Response", "Time", "Last attempt"], (deliveries.items || []).map((d) => row([
        d.type || "", d.subject || "", d.phase || "", d.attempts ?? "", d.lastError || "", d.responseCode ?? "", localTime(d.time), localTime(d.lastAttemptTime)]))));
  } catch (e) {
    clear(out, statusBox(e));
  }
}

// ---- pages: operator ------------------------------------------------------------------------

// Prometheus' text format, as /metrics exports it: name{labels} value.
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) for (const part of m[3].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[part[1]] = part[2];
    samples.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return samples;
}

async function metrics() {
  const response = await api("/metrics");
  if (!response.ok) throw new ApiError({ code: response.status, ...(await response.json().catch(() => ({}))) });
  return parseMetrics(await response.text());
}

async function listAll(path, limit = 5000) {
  const items = [];
  let cont = "";
  do {
    const list = await json(`${path}?limit=${limit}${cont ? `&continue=${encodeURIComponent(cont)}` : ""}`);
    items.push(...(list.items || []));
    cont = list.metadata.continue || "";
  } while (cont);
  return items;
}

async function poolPage() {
  const status = el("div");
  const figure = el("div", { class: "cards", id: "pool-figures" });
  const canvas = el("canvas", { id: "heatmap", width: 1200, height: 200 });
  const tooltip = el("div", { id: "tooltip", hidden: true });
  clear(main, el("h1", {}, "Pool"), figure,
    el("div", { class: "legend" }, el("span", {}, el("span", { class: "swatch sw-free" }), "free"),
      el("span", {}, el("span", { class: "swatch sw-half" }), "half allocated"),
      el("span", {}, el("span", { class: "swatch sw-full" }), "fully allocated"),
      el("span", {}, el("span", { class: "swatch sw-fault" }), "faulty"),
      el("span", {}, el("span", { class: "swatch sw-cordon" }), "cordoned node"),
      el("span", { class: "muted" }, "Each GPU: left half VRAM, right half SM allocated; nodes in racks, racks in zones; a gap between NVLink domains.")),
    status, canvas, tooltip);
  try {
    const [nodes, gpus, samples] = await Promise.all([listAll("/api/v1/nodes"), listAll("/apis/tessera.io/v1/gpudevices"), metrics().catch(() => [])]);
    const cordoned = new Set(nodes.filter((n) => n.spec && n.spec.unschedulable).map((n) => n.metadata.name));
    const labels = Object.fromEntries(nodes.map((n) => [n.metadata.name, n.metadata.labels || {}]));
    const started = performance.now();
    const layout = layoutPool(gpus.map((g) => toCell(g, labels[g.spec.nodeName] || {}, cordoned)), canvas.parentElement.clientWidth - 4);
    drawHeatmap(canvas, layout);
    const ms = performance.now() - started;
    canvas.dataset.drawMs = ms.toFixed(1);
    canvas.dataset.gpus = String(gpus.length);
    const fragments = samples.filter((s) => s.name === "tessera_pool_fragment_ratio");
    const faulty = gpus.filter((g) => g.status.health !== "Healthy").length;
    clear(figure, [["GPUs", gpus.length], ["Faulty", faulty], ["Cordoned nodes", cordoned.size],
      ["Fragmentation", fragments.length ? fragments.map((f) => `${f.labels.zone}/${f.labels.gpu_model}: ${(100 * f.value).toFixed(1)}%`).join("  ") : "—"],
      ["Drawn in", `${ms.toFixed(0)} ms`]].map(([k, v]) => el("div", { class: "card" }, el("div", { class: "muted" }, k), el("div", { class: "value" }, String(v)))));
    attachTooltip(canvas, tooltip, layout);
    canvas.layout = layout; // where each GPU is drawn (read by the browser tests)
  } catch (e) {
    clear(status, statusBox(e));
  }
}

function share(amount, free) {
  const a = quantity(amount), f = quantity(free);
  return a + f > 0 ? a / (a + f) : 0;
}

export function quantity(text) {
  const m = /^([\d.]+)([KMGTPE]i?|m)?$/.exec(String(text || "0"));
  if (!m) return 0;
  const units = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, K: 1e3, M: 1e6, G: 1e9, T: 1e12, m: 1e-3 };
  return Number(m[1]) * (units[m[2]] || 1);
}

function toCell(g, nodeLabels, cordoned) {
  const s = g.status;
  return {
    name: g.metadata.name, node: g.spec.nodeName, index: g.spec.index, model: g.spec.model,
    zone: nodeLabels["topology.kubernetes.io/zone"] || "", rack: nodeLabels["tessera.io/rack"] || "",
    domain: g.spec.nvlinkDomain || "",
    vram: share(s.allocated.memory, s.free.memory), sm: (s.allocated.corePercent || 0) / 100,
    faulty: s.health !== "Healthy", cordoned: cordoned.has(g.spec.nodeName),
    memory: g.spec.memory, pods: s.pods || [], allocated: s.allocated,
  };
}

function attachTooltip(canvas, tooltip, layout) {
  canvas.addEventListener("mousemove", (event) => {
    const rect = canvas.getBoundingClientRect();
    const cell = layout.at(event.clientX - rect.left, event.clientY - rect.top);
    if (!cell) { tooltip.hidden = true; return; }
    tooltip.hidden = false;
    tooltip.textContent = [
      `${cell.name} (${cell.model}, ${cell.memory})`,
      `node ${cell.node}  zone ${cell.zone}  rack ${cell.rack}  NVLink ${cell.domain}`,
      `VRAM ${(cell.vram * 100).toFixed(0)}%  SM ${(cell.sm * 100).toFixed(0)}%${cell.faulty ? "  FAULTY" : ""}${cell.cordoned ? "  node cordoned" : ""}`,
      ...cell.pods.map((p) => `  ${p.namespace}/${p.name}: ${p.memory}, ${p.corePercent}% SM`),
    ].join("\n");
    tooltip.style.left = `${event.clientX + 14}px`;
    tooltip.style.top = `${event.clientY + 14}px`;
  });
  canvas.addEventListener("mouseleave", () => { tooltip.hidden = true; });
}

async function nodesPage() {
  const out = el("div");
  const message = el("div", { id: "node-message" });
  clear(main, el("h1", {}, "Nodes"), message, out);
  const load = async () => {
    const [nodes, gpus] = await Promise.all([listAll("/api/v1/nodes"), listAll("/apis/tessera.io/v1/gpudevices")]);
    const faulty = gpus.filter((g) => g.status.health !== "Healthy");
    const act = (label, fn) => async () => {
      message.textContent = `${label}…`;
      try { await fn(); message.textContent = `${label}: done`; await load(); } catch (e) { clear(message, statusBox(e)); }
    };
    const cordon = (name, on) => json(`/api/v1/nodes/${encodeURIComponent(name)}`, {
      method: "PATCH", headers: { "Content-Type": "application/merge-patch+json" },
      body: JSON.stringify({ spec: { unschedulable: on } }),
    });
    const drain = async (name) => {
      await cordon(name, true);
      const pods = await json(`/api/v1/pods?fieldSelector=${encodeURIComponent(`spec.nodeName=${name}`)}`);
      for (const p of pods.items || []) {
        await json(`/api/v1/namespaces/${encodeURIComponent(p.metadata.namespace)}/pods/${encodeURIComponent(p.metadata.name)}/eviction`, {
          method: "POST", headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ apiVersion: "policy/v1", kind: "Eviction", metadata: { name: p.metadata.name, namespace: p.metadata.namespace } }),
        });
      }
    };
    clear(out, table(["Name", "Zone", "Rack", "Ready", "Schedulable", "GPUs", "Faulty GPUs", "Actions"], nodes.map((n) => {
      const name = n.metadata.name;
      const ready = ((n.status && n.status.conditions) || []).find((c) => c.type === "Ready");
      const bad = faulty.filter((g) => g.spec.nodeName === name);
      const labels = n.metadata.labels || {};
      return row([name, labels["topology.kubernetes.io/zone"] || "", labels["tessera.io/rack"] || "",
        ready ? ready.status : "Unknown", n.spec && n.spec.unschedulable ? "cordoned" : "yes",
        (n.status.capacity && n.status.capacity["nvidia.com/gpu"]) || "0", bad.map((g) => g.metadata.name).join(", "),
        el("span", {},
          n.spec && n.spec.unschedulable
            ? el("button", { type: "button", onclick: act(`Uncordon ${name}`, () => cordon(name, false)) }, "Uncordon")
            : el("button", { type: "button", onclick: act(`Cordon ${name}`, () => cordon(name, true)) }, "Cordon"),
          el("button", { type: "button", onclick: act(`Drain ${name}`, () => drain(name)) }, "Drain"),
          bad.map((g) => el("button", { type: "button", onclick: act(`Repair ${g.metadata.name}`, () => json(`/apis/tessera.io/v1/gpudevices/${encodeURIComponent(g.metadata.name)}/repair`, {
            method: "POST", headers: { "Content-Type": "application/json" }, body: "{}",
          })) }, `Repair ${g.metadata.name}`)))]);
    })));
  };
  try { await load(); } catch (e) { clear(out, statusBox(e)); }
}

async function tenantsPage() {
  const out = el("div");
  clear(main, el("h1", {}, "Tenants"), out);
  try {
    const [tenants, usage] = await Promise.all([
      json("/apis/tessera.io/v1/tenants"),
      json("/apis/billing.tessera.io/v1/usage?granularity=day&groupBy=namespace"),
    ]);
    const spend = (tenant) => usage.items.filter((r) => r.namespace === tenant || (r.namespace || "").startsWith(`${tenant}-`))
      .reduce((sum, r) => sum + Number(r.amount), 0);
    clear(out, table(["Tenant", "Created", "Spend today (UTC day)"], (tenants.items || []).map((t) =>
      row([t.metadata.name, localTime(t.metadata.creationTimestamp), money(spend(t.metadata.name), usage.currency)]))));
  } catch (e) {
    clear(out, statusBox(e));
  }
}

async function schedulerPage() {
  const out = el("div", { class: "cards", id: "scheduler-figures" });
  const note = el("p", { class: "muted" }, "From /metrics, read every 5 seconds.");
  clear(main, el("h1", {}, "Scheduler"), note, out);
  let previous = null;
  const sum = (samples, name, filter = () => true) => samples.filter((s) => s.name === name && filter(s.labels)).reduce((a, s) => a + s.value, 0);
  const tick = async () => {
    try {
      const samples = await metrics();
      const now = performance.now();
      const binds = sum(samples, "scheduler_schedule_attempts_total", (l) => l.result === "scheduled");
      const rate = previous ? (binds - previous.binds) / ((now - previous.at) / 1000) : 0;
      previous = { binds, at: now };
      const count = sum(samples, "scheduler_pod_scheduling_duration_seconds_count");
      const total = sum(samples, "scheduler_pod_scheduling_duration_seconds_sum");
      // The leader is who holds the scheduler's Lease (a lone embedded scheduler holds none).
      const lease = await json("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/tessera-scheduler").catch(() => null);
      const leader = lease && lease.spec && lease.spec.holderIdentity
        ? `${lease.spec.holderIdentity} (renewed ${age(lease.spec.renewTime)} ago)`
        : "one scheduler, no election";
      clear(out, [["Leader", leader],
        ["Queue depth", sum(samples, "scheduler_pending_pods")],
        ["Binds per second", rate.toFixed(1)],
        ["Create-to-bind latency (mean)", count ? `${((total / count) * 1000).toFixed(0)} ms` : "—"],
        ["Pods bound", binds]].map(([k, v]) => el("div", { class: "card" }, el("div", { class: "muted" }, k), el("div", { class: "value" }, String(v)))));
    } catch (e) {
      clear(out, statusBox(e));
    }
  };
  await tick();
  window.setInterval(tick, 5000);
}

// ---- start ----------------------------------------------------------------------------------

const PAGES = {
  pods: podsPage, pod: podPage, create: createPage, usage: usagePage, callbacks: callbacksPage,
  callback: callbackPage, pool: poolPage, nodes: nodesPage, tenants: tenantsPage, scheduler: schedulerPage,
};

async function start() {
  if (PAGE === "login") { await loginPage(); return; }
  const response = await fetch("/ui/session", { credentials: "same-origin" });
  if (!response.ok) { window.location.assign("/ui/login"); return; }
  session = await response.json();
  document.getElementById("who").textContent = session.user;
  const nav = document.getElementById("nav");
  nav.hidden = false;
  nav.querySelector(".operator-nav").hidden = session.role !== "admin";
  for (const a of nav.querySelectorAll("a[data-page]")) if (a.dataset.page === PAGE) a.className = "current";
  const logout = document.getElementById("logout");
  logout.hidden = false;
  logout.addEventListener("click", async () => {
    await fetch("/ui/logout", { method: "POST", credentials: "same-origin", headers: { "X-Tessera-CSRF": session.csrf } });
    window.location.assign("/ui/login");
  });
  // A revoked token ends the session: the watches the page holds were let in before, so the
  // session is checked again every 15 seconds.
  window.setInterval(async () => {
    const check = await fetch("/ui/session", { credentials: "same-origin" }).catch(() => null);
    if (check && check.status === 401) window.location.assign("/ui/login");
  }, 15000);
  await PAGES[PAGE]();
}

start().catch((e) => clear(main, statusBox(e)));
