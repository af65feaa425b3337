// The memory inspector: one page over the HTTP API. It holds the API key in sessionStorage (never
// in a cookie: a page elsewhere cannot make this browser send it) and builds every node with
// textContent, never HTML from data: what is remembered is shown, not run.
"use strict";

const DAY = 86400000;
const PAGE = 100;  // memories a page shows before "load more"
const $ = (id) => document.getElementById(id);
const state = { key: null, me: null, user: null, opened: 0, facts: null, episodes: null, asked: {}, earliest: null,
  days: 0, drawn: 0 };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== null && value !== undefined && value !== false) node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

// Dates and times as the API gives them, in UTC (the page says so): a turn near midnight is on
// the same day for every reader of it.
const day = (iso) => (iso ? iso.slice(0, 10) : "");

function notice(text, error) {
  $("notice").textContent = text || "";
  $("notice").className = error ? "error" : "";
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${state.key}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, (data && (data.detail || data.title)) || response.statusText);
  return data;
}

const userPath = (suffix) => `/v1/users/${encodeURIComponent(state.user)}${suffix || ""}`;

// A reply for a user opened before the one shown now is dropped: switching quickly must never
// show one person's memory under another's name.
function stillOpen(opened) {
  return opened === state.opened;
}

// --- signing in -----------------------------------------------------------------------------

function fromHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  const given = params.get("key"), held = sessionStorage.getItem("memstream-key");
  // A link signs in a page that is not signed in; it never swaps the key of one that is (a page
  // elsewhere could link here with its own key, and what is typed next would go to its tenant).
  if (given && !held) sessionStorage.setItem("memstream-key", given);
  state.otherKey = Boolean(given && held && given !== held);
  params.delete("key");  // a key stays out of the address bar and the history
  history.replaceState(null, "", location.pathname + (params.toString() ? `#${params}` : ""));
  return params.get("user");
}

async function signIn(wanted) {
  state.key = sessionStorage.getItem("memstream-key");
  $("key-form").hidden = Boolean(state.key);
  $("user-form").hidden = !state.key;
  if (!state.key) return notice("Paste an API key (memstream api-keys create) to see the memory it reaches.");
  try {
    state.me = await api("GET", "/v1/me");
  } catch (err) {
    sessionStorage.removeItem("memstream-key");
    state.key = null;
    $("key-form").hidden = false;
    $("user-form").hidden = true;
    return notice(`That key was refused: ${err.message}`, true);
  }
  const who = state.me.operator ? `Signed in as ${state.me.name} (operator): every user.`
    : `Signed in as ${state.me.name}: the users of tenant ${state.me.tenant}.`;
  notice(state.otherKey ? `${who} A link asked to sign in with another key: sign out first to use it.` : who,
    state.otherKey);
  const page = await api("GET", "/v1/users?limit=200");
  $("user-list").replaceChildren(...page.users.map((u) => el("option", { value: u })));
  if (wanted) {
    $("user-filter").value = wanted;
    await openUser(wanted);
  }
}

// --- one user -------------------------------------------------------------------------------

async function openUser(userId) {
  const opened = ++state.opened;
  state.user = userId;
  state.facts = state.episodes = state.refused = null;  // no "load more" may go on from another user's pages
  $("facts-more").replaceChildren();
  $("refused-more").replaceChildren();
  $("episodes").querySelectorAll("button.more").forEach((b) => b.remove());
  delete $("user").dataset.loaded;
  history.replaceState(null, "", `${location.pathname}#${new URLSearchParams({ user: userId })}`);
  $("user-name").textContent = userId;
  $("user").hidden = false;
  try {
    await Promise.all([showProfile(), showFacts(), showGraph(null, true), showEpisodes(), showRefused(), showOps()]);
    if (stillOpen(opened)) $("user").dataset.loaded = userId;
  } catch (err) {
    if (stillOpen(opened)) notice(`Could not load ${userId}: ${err.message}`, true);
  }
}

async function showProfile() {
  const opened = state.opened;
  const overview = await api("GET", userPath());
  if (!stillOpen(opened)) return;
  const entries = Object.entries(overview.profile || {});
  $("profile").replaceChildren(...(entries.length ? entries.flatMap(([k, v]) => [el("dt", {}, k),
    el("dd", {}, typeof v === "object" ? JSON.stringify(v) : v)]) : [el("dd", { class: "quiet" }, "no profile yet")]));
  const s = overview.stats;
  const count = (kind) => Object.values(kind.by_status).reduce((a, b) => a + b, 0);
  $("stats").textContent = `${count(s.facts)} fact versions (${s.facts.by_status.current || 0} current), ` +
    `${count(s.episodes)} episodes in ${s.conversations} conversations, ${s.entities} entities, ` +
    `${count(s.edges)} relationships; last change ${day(s.last_recorded) || "never"}`;
}

// A kind's pages, oldest first: the first again on a (re)load, the next one on "Load more". Only
// the latest ask of a kind is shown (a reload after a change supersedes a "load more" under way).
async function pageOf(kind, more) {
  const opened = state.opened;
  const held = more ? state[kind] : { items: [], next: null, opened };
  if (!held || held.opened !== opened) return null;
  const asked = (state.asked[kind] = (state.asked[kind] || 0) + 1);
  const query = new URLSearchParams({ kind, limit: PAGE });
  if (more) query.set("cursor", held.next);
  const page = await api("GET", userPath(`/memories?${query}`));
  if (!stillOpen(opened) || asked !== state.asked[kind]) return null;
  state[kind] = { items: [...held.items, ...page.items], next: page.next_cursor, opened };
  return state[kind];
}

function moreButton(kind, shown, show) {
  if (!shown.next) return null;
  return el("button", { type: "button", class: "more", "data-kind": kind, onclick: () => show(true)
    .catch((err) => notice(`Could not load more ${kind}: ${err.message}`, true)) },
  `${shown.items.length} shown, oldest first: load more`);
}

async function showFacts(more) {
  const shown = await pageOf("facts", more);
  if (!shown) return;
  const said = new Map(shown.items.map((f) => [f.fact_id, f.text]));
  // A reflection names the facts it was drawn from (shown by what they say when on this page)
  // and the turns, by how many: the turns are on the turns tab.
  const turns = (f) => (f.derived_from_turns || []).length;
  const drawn = (f) => (f.derived_from || []).length || turns(f) ? [el("div", { class: "quiet sources" },
    `drawn from: ${[...(f.derived_from || []).map((id) => said.get(id) || id),
      ...(turns(f) ? [`${turns(f)} of your turns`] : [])].join("; ")}`)] : [];
  const rows = shown.items.map((f) => el("tr", { "data-fact-id": f.fact_id },
    el("td", {}, f.text, ...drawn(f)), el("td", {}, `${f.category} · ${f.attribute}`), el("td", {}, day(f.valid_from)),
    el("td", {}, f.confidence.toFixed(2), f.observation_count > 1 ? ` · seen ${f.observation_count}×` : ""),
    el("td", { class: "actions" },
      el("button", { type: "button", class: "history", onclick: (e) => toggleHistory(e.target, f) }, "History"),
      el("button", { type: "button", class: "correct", onclick: (e) => toggleCorrect(e.target, f) }, "Correct"),
      el("button", { type: "button", class: "danger forget", onclick: (e) => forgetFact(e.target, f) }, "Forget"))));
  $("facts").tBodies[0].replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: 5, class: "quiet" }, "no facts believed"))]));
  $("facts-more").replaceChildren(...[moreButton("facts", shown, showFacts)].filter(Boolean));
}

function besideRow(button, kind, build) {
  const row = button.closest("tr");
  const next = row.nextElementSibling;
  if (next && next.dataset.for === kind) return next.remove();
  row.after(el("tr", { class: "history", "data-for": kind }, el("td", { colspan: 5 }, build())));
}

async function toggleHistory(button, fact) {
  const opened = state.opened;
  let versions;
  try {
    versions = await api("GET", userPath(`/facts/${fact.fact_id}/history`));
  } catch (err) {
    return stillOpen(opened) && notice(`history failed: ${err.message}`, true);
  }
  if (!stillOpen(opened) || !button.isConnected) return;
  besideRow(button, "history", () => el("ol", { class: "versions" }, versions.map((v) => el("li", {},
    el("span", { class: `status ${v.status}` }, v.status), ` v${v.version} `, el("strong", {}, v.text),
    ` — true ${day(v.valid_from)} → ${v.valid_to ? day(v.valid_to) : "now"}, recorded ${day(v.recorded_at)}`,
    el("div", {}, `recorded because: ${v.reason}`, v.end_reason ? `; ended because: ${v.end_reason}` : ""),
    el("div", { class: "quiet" }, `decision ${v.decision_id || "?"} by ${v.resolver || "?"} (extracted by ` +
      `${v.extractor || "?"}) from event ${v.source_event_id || "?"}`),
    v.source_turn ? el("blockquote", {}, `${v.source_turn.conversation_id}, ${day(v.source_turn.occurred_at)}: ` +
      `“${v.source_turn.user_message}”`) : el("div", { class: "quiet" }, "not from a remembered turn")))));
}

function toggleCorrect(button, fact) {
  besideRow(button, "correct", () => {
    const value = el("input", { name: "value", value: fact.value, required: true, "aria-label": "value" });
    const text = el("input", { name: "text", value: fact.text, "aria-label": "sentence" });
    return el("form", { class: "correct", onsubmit: async (e) => {
      e.preventDefault();
      await change(() => api("POST", userPath(`/facts/${fact.fact_id}/correct`),
        { value: value.value, text: text.value || null, actor: actor(), reason: "corrected in the inspector" }),
      "correction");
    } }, value, text, el("button", { type: "submit" }, "Save correction"));
  });
}

async function forgetFact(button, fact) {
  if (!button.classList.contains("armed")) {  // two clicks: a forget cannot be undone
    button.classList.add("armed");
    button.textContent = "Forget for good?";
    // Say which turns go with it before they go.
    const going = await api("GET", userPath(`/facts/${fact.fact_id}/episodes`));
    const said = going.map((e) => `“${e.user_message.slice(0, 80)}”`).join(", ");
    notice(going.length ? `Forgetting “${fact.text}” also forgets the ${going.length === 1 ? "turn" : `${going.length} turns`} it was read from: ${said}.`
      : `Forgetting “${fact.text}” forgets no turn: none it was read from is remembered.`);
    return;
  }
  await change(() => api("POST", userPath("/forget"),
    { fact_id: fact.fact_id, actor: actor(), reason: "forgotten in the inspector" }), "forget");
}

const actor = () => (state.me && state.me.operator ? "operator" : "user");

// Append a command, then show its effect once every projection has applied it.
async function change(append, what) {
  try {
    const done = await append();
    notice(`${what} appended at ${done.position.topic}[${done.position.partition}]@${done.position.offset}; waiting for the projections…`);
    const seen = await api("POST", "/v1/caught-up", { position: done.position, timeout: 15 });
    await Promise.all([showProfile(), showFacts(), showGraph(currentAsOf()), showEpisodes()]);
    notice(seen.caught_up ? `${what} applied.` : `${what} appended; the projections have not applied it yet (reload later).`,
      !seen.caught_up);
  } catch (err) {
    notice(`${what} failed: ${err.message}`, true);
  }
}

// --- the graph, as of a date ----------------------------------------------------------------

function currentAsOf() {
  const slider = $("graph-slider");
  if (state.earliest === null || Number(slider.value) >= Number(slider.max)) return null;  // the far end: now
  return new Date(state.earliest + (Number(slider.value) + 1) * DAY - 1).toISOString();  // the day's end
}

async function showGraph(asOf, first) {
  const query = new URLSearchParams();
  if (asOf) {
    query.set("valid_time", asOf);
    if ($("graph-recorded").checked) query.set("recorded_time", asOf);
  }
  const ticket = ++state.drawn;
  const graph = await api("GET", userPath(`/graph?${query}`));
  if (ticket !== state.drawn) return;  // a later date or another user was asked for meanwhile
  // One position per day from the first relationship's to the last change's, then now; laid out
  // again when a change moved either end (the slider keeps its date, or now).
  const earliest = graph.earliest ? Date.parse(graph.earliest.slice(0, 10)) : null;
  const days = graph.earliest ? Math.floor((Date.parse(graph.latest) - earliest) / DAY) + 1 : 0;
  if (first || earliest !== state.earliest || days !== state.days) {
    [state.earliest, state.days] = [earliest, days];
    const at = asOf && earliest !== null ? Math.floor((Date.parse(asOf) - earliest) / DAY) : days;
    $("graph-slider").max = days;
    $("graph-slider").value = Math.min(days, Math.max(0, at));
    $("graph-slider").disabled = !days;
  }
  $("graph-date").textContent = asOf ? `as of ${day(asOf)} (UTC)${$("graph-recorded").checked ? ", as recorded then" : ""}` : "now";
  $("graph-section").dataset.asOf = asOf ? day(asOf) : "now";
  draw(graph);
}

function layout(nodes) {
  const others = nodes.filter((n) => !n.is_user);
  const at = {};
  nodes.filter((n) => n.is_user).forEach((n) => { at[n.id] = [360, 210]; });
  others.forEach((n, i) => {
    const angle = (2 * Math.PI * i) / Math.max(others.length, 1) - Math.PI / 2;
    at[n.id] = [360 + 300 * Math.cos(angle), 210 + 170 * Math.sin(angle)];
  });
  return at;
}

function draw(graph) {
  const at = layout(graph.nodes);
  const held = new Set(graph.edges.flatMap((e) => [e.source_id, e.target_id]));
  const pairs = {};
  const edges = graph.edges.filter((e) => at[e.source_id] && at[e.target_id]).map((e) => {
    const [x1, y1] = at[e.source_id];
    const [x2, y2] = at[e.target_id];
    const pair = [e.source_id, e.target_id].sort().join();
    const nth = (pairs[pair] = (pairs[pair] || 0) + 1) - 1;
    const g = svg("g", { class: "edge", "data-edge-id": e.edge_id, "data-relation": e.relation, "data-target": e.target });
    g.append(svg("line", { x1, y1, x2, y2 }),
      svg("text", { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 4 + 13 * nth, "text-anchor": "middle" }, e.relation));
    g.append(svg("title", {}, e.fact_sentence));
    return g;
  });
  const nodes = graph.nodes.map((n) => {
    const [x, y] = at[n.id];
    const g = svg("g", { class: `node${n.is_user ? " user" : ""}${held.has(n.id) ? "" : " idle"}`, "data-node": n.name });
    g.append(svg("circle", { cx: x, cy: y, r: n.is_user ? 9 : 6 }),
      svg("text", { x, y: y + 22, "text-anchor": "middle" }, n.is_user ? state.user : n.name));
    return g;
  });
  $("graph").replaceChildren(...edges, ...nodes);
  $("graph-edges").replaceChildren(...(graph.edges.length ? graph.edges.map((e) => el("li", {},
    `${e.fact_sentence} (${day(e.valid_from)} → ${e.valid_to ? day(e.valid_to) : "now"})`))
    : [el("li", {}, "no relationships held then")]),
  ...(graph.truncated ? [el("li", { class: "truncated" }, "only the first 300 people, places and things are drawn")] : []));
}

// --- episodes and the pipeline --------------------------------------------------------------

async function showRefused(more) {
  const shown = await pageOf("refused", more);
  if (!shown) return;
  const rows = shown.items.map((r) => el("tr", { "data-decision-id": r.decision_id },
    el("td", {}, r.text), el("td", {}, r.refusal.replace("_", " ")), el("td", {}, r.reason),
    el("td", { class: "quiet" }, r.evidence || "")));
  $("refused").tBodies[0].replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: 4, class: "quiet" }, "nothing refused"))]));
  $("refused-more").replaceChildren(...[moreButton("refused", shown, showRefused)].filter(Boolean));
}

async function showEpisodes(more) {
  const shown = await pageOf("episodes", more);
  if (!shown) return;
  const byConversation = new Map();
  for (const e of shown.items) {
    if (!byConversation.has(e.conversation_id)) byConversation.set(e.conversation_id, []);
    byConversation.get(e.conversation_id).push(e);
  }
  $("episodes").replaceChildren(...(byConversation.size ? [...byConversation].map(([id, turns]) =>
    el("div", { class: "conversation" }, el("h3", {}, `${id} `, el("small", { class: "quiet" },
      `${day(turns[0].occurred_at)} · ${turns.length} turn${turns.length > 1 ? "s" : ""}`)),
    turns.map((t) => el("p", { class: "turn", "data-episode-id": t.episode_id },
      el("time", { datetime: t.occurred_at }, t.occurred_at.slice(0, 16).replace("T", " ")),
      el("span", { class: "said" }, t.user_message), el("span", { class: "answer" }, t.assistant_message)))))
    : [el("p", { class: "quiet" }, "no remembered turns")]), ...[moreButton("episodes", shown, showEpisodes)].filter(Boolean));
}

async function showOps() {
  const opened = state.opened;
  if (!state.me.operator) {
    $("ops").replaceChildren(el("p", { class: "quiet" }, "Lag and dead letters are shown to operator keys."));
    return;
  }
  const status = await api("GET", "/v1/status");
  if (!stillOpen(opened)) return;
  const lagging = status.positions.filter((p) => p.lag > 0);
  $("ops").replaceChildren(
    el("p", {}, `max lag ${status.max_lag} records · dead letters ${status.dead_letters}`,
      status.last_dead_letter ? ` (last: ${status.last_dead_letter.stage}: ${status.last_dead_letter.reason})` : ""),
    el("table", { id: "lag" }, el("thead", {}, el("tr", {}, ["projection", "topic", "part", "applied", "end", "lag"]
      .map((h) => el("th", {}, h)))),
    el("tbody", {}, (lagging.length ? lagging : status.positions).slice(0, 24).map((p) => el("tr", {},
      [p.projection, p.topic, p.partition, p.applied, p.end, p.lag].map((v) => el("td", {}, v)))))));
}

// --- wiring ---------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem("memstream-key", $("key").value.trim());
    $("key").value = "";
    signIn(null);
  });
  $("user-form").addEventListener("submit", (e) => {
    e.preventDefault();
    if ($("user-filter").value.trim()) openUser($("user-filter").value.trim());
  });
  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem("memstream-key");
    location.hash = "";
    location.reload();
  });
  let pending = null;
  const redraw = () => {
    clearTimeout(pending);
    pending = setTimeout(() => showGraph(currentAsOf()).catch((err) => notice(err.message, true)), 120);
  };
  $("graph-slider").addEventListener("input", redraw);
  $("graph-recorded").addEventListener("change", redraw);
  // A sign-in link opened in a tab already showing the page (the same document: no reload).
  window.addEventListener("hashchange", () => signIn(fromHash()).catch((err) => notice(err.message, true)));
  signIn(fromHash()).catch((err) => notice(err.message, true));
});
