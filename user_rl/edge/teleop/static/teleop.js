// One robot's teleop page: state and camera frames come over a websocket; so do people's
// commands. The key/gamepad mapping comes from the server (the same one it shows here).
// A lost connection is said over the whole view, the controls that cannot work are off, and the
// page reconnects with backoff; an e-stop pressed meanwhile is sent on reconnect (and shown as not
// delivered until the robot acknowledges it).
"use strict";

const token = new URLSearchParams(location.search).get("token") || "";
const $ = (id) => document.getElementById(id);
const now = () => performance.timeOrigin + performance.now(); // wall clock, sub-millisecond

const teleop = {
  ws: null, welcome: null, state: null, driving: false,
  held: new Set(), gamepadAction: null, gripper: 0,
  commandId: 0, lastAction: null, keyTimes: new Map(),  // command id -> when its key was pressed
  clockOffset: 0, bestRtt: Infinity,                     // robot clock - page clock (ms)
  latencies: [],                                         // {id, total_ms, server_ms}
  frames: {},                                            // camera -> frames received
  frameAges: {},                                         // camera -> last 200 camera -> screen ages (ms)
  connected: false, attempts: 0, lastMessage: 0,         // reconnection with backoff
  drops: 0,                                              // connections lost since the page opened
  estopPending: null,                                    // when an e-stop not yet acknowledged was pressed
  pendingLabel: null, labelsUndone: 0,                   // a label in its undo window (input.js)
};
const STALE_MS = 3000;                                   // no message this long: the connection is gone
const BACKOFF_MS = [250, 500, 1000, 2000, 4000, 8000];
window.teleop = teleop;

function send(message) {
  if (teleop.ws && teleop.ws.readyState === WebSocket.OPEN) teleop.ws.send(JSON.stringify(message));
}

function say(text) { $("message").textContent = text; }

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${scheme}://${location.host}/ws?token=${encodeURIComponent(token)}`);
  ws.binaryType = "arraybuffer";
  teleop.ws = ws;
  teleop.lastMessage = Date.now() + 2000;  // give a connection attempt 5 s in all
  ws.onopen = () => {
    teleop.lastMessage = Date.now();
    const name = new URLSearchParams(location.search).get("name");
    if (name) send({type: "hello", name});  // first, so that the log and latch name who stopped
    if (teleop.estopPending !== null) send({type: "estop"});  // pressed while disconnected
    ping();
  };
  ws.onclose = () => disconnected(ws);
  ws.onmessage = (event) => {
    if (ws !== teleop.ws) return;
    teleop.lastMessage = Date.now();
    if (typeof event.data !== "string") return showFrame(event.data);
    const message = JSON.parse(event.data);
    const handler = handlers[message.type];
    if (handler) handler(message);
  };
}

// The connection is gone (closed, or silent for STALE_MS): say so, turn controls off, retry with backoff.
function disconnected(ws) {
  if (ws !== teleop.ws) return;  // an abandoned socket closing late
  ws.onclose = ws.onmessage = null;
  try { ws.close(); } catch (e) { /* already closed */ }
  teleop.ws = null;
  teleop.drops += 1;
  teleop.connected = false;
  teleop.driving = false;
  teleop.held.clear();
  teleop.lastAction = null;
  const delay = BACKOFF_MS[Math.min(teleop.attempts, BACKOFF_MS.length - 1)] * (0.8 + 0.4 * Math.random());
  teleop.attempts += 1;
  $("connection").textContent = "disconnected";
  $("offline-status").textContent = `reconnecting: attempt ${teleop.attempts} in ${(delay / 1000).toFixed(1)} s`;
  showConnection();
  setTimeout(connect, delay);
}

// A socket that went silent (or never opened) is as good as closed. Silence counts only while the
// page itself runs: a page that got no CPU (a frozen tab, a busy laptop, a suspended lid) wakes up
// before the messages queued meanwhile reach it, and must not call that the connection's silence.
const WATCHDOG_MS = 500;
let lastWatchdog = Date.now();
setInterval(() => {
  const ws = teleop.ws;
  const late = Date.now() - lastWatchdog - WATCHDOG_MS;
  lastWatchdog = Date.now();
  if (late > WATCHDOG_MS) teleop.lastMessage += late;  // the page was frozen this long
  if (ws && ws.readyState <= WebSocket.OPEN && Date.now() - teleop.lastMessage > STALE_MS) disconnected(ws);
}, WATCHDOG_MS);

// While disconnected the whole view says so and every control but the e-stop is off.
function showConnection() {
  const up = teleop.connected;
  $("offline").hidden = up;
  if (teleop.welcome) $("offline-hold").textContent = `${teleop.welcome.hand_back_after_s} s`;
  const byState = new Set(["take-over", "hand-back", "mark-success", "mark-failure", "discard", "reset", "rearm"]);
  for (const button of document.querySelectorAll("#panel button")) {
    if (button.id === "estop") continue;
    if (!up) button.disabled = true;
    else if (!byState.has(button.id)) button.disabled = false;  // the state message sets the others
  }
  const pending = teleop.estopPending;
  const text = pending === null ? "" : `E-STOP NOT DELIVERED (pressed ${new Date(pending).toLocaleTimeString()}): ` +
    (up ? "sending…" : "it is sent when the page reconnects; stop the robot another way now " +
      "(user-rl estop on its controller, or its hardware stop)");
  for (const id of ["estop-status", "offline-estop-status"]) {
    $(id).textContent = text;
    $(id).className = pending === null ? "" : "undelivered";
  }
}

function pressEstop() {
  if (teleop.estopPending === null) teleop.estopPending = Date.now();
  send({type: "estop"});
  showConnection();
}

const handlers = {
  welcome(m) {
    teleop.welcome = m;
    teleop.connected = true;
    teleop.attempts = 0;
    $("connection").textContent = "connected";
    showConnection();
    $("you").textContent = m.name;
    buildViews(m.cameras);
    buildMapping(m.mapping);
    $("gripper").hidden = !m.has_gripper;
  },
  state(m) {
    teleop.state = m;
    teleop.driving = m.you_drive;
    $("policy-version").textContent = m.policy_version < 0 ? "none yet (warm-up)" : m.policy_version;
    $("episode").textContent = m.episode;
    $("step").textContent = m.step;
    $("episode-steps").textContent = (m.episode_limit ? `${m.episode_steps} of ${m.episode_limit}` :
      `${m.episode_steps} (no step limit)`) + (m.episode_ended ? ": ended" : "");
    $("reward").textContent = m.reward.toFixed(3);
    $("actor").textContent = m.actor;
    $("driver").textContent = m.driver + (m.you_drive ? " (you)" : "") + (m.holding_s === null ? "" :
      ` (connection lost: holding still, policy in ${m.holding_s.toFixed(0)} s)`);
    $("driver").className = m.you_drive ? "driving" : "";
    $("you").textContent = m.you;
    $("viewers").textContent = m.viewers;
    $("last-label").textContent = m.last_label ? `${m.last_label.label.replace("LABEL_", "").toLowerCase()} ` +
      `(episode ${m.last_label.episode}, step ${m.last_label.step})` : "-";
    $("rearmed").textContent = m.rearmed ? `by ${m.rearmed.by} at ${new Date(m.rearmed.time * 1000).toLocaleTimeString()}` +
      ` (cleared: ${m.rearmed.reason})` : "-";
    const someoneElse = m.teleop_driver !== null && !m.you_drive && m.holding_s === null;
    $("take-over").disabled = m.you_drive || someoneElse;
    $("hand-back").disabled = !m.you_drive;
    for (const id of ["mark-success", "mark-failure", "discard", "reset"]) $(id).disabled = someoneElse || m.episode_ended;
    $("estop-banner").hidden = !m.estop;
    $("estop-banner").textContent = m.estop ? `EMERGENCY STOP: ${m.estop} (set by the ${m.estop_source}` +
      `${m.estop_by ? ": " + m.estop_by : ""})` : "";
    $("rearm").disabled = !m.estop || !teleop.welcome.operators;
    $("rearm").title = teleop.welcome.operators ? "needs an operator credential" :
      "no operators for this robot: re-arm with user-rl rearm on its controller";
    if (!m.estop) $("rearm-dialog").hidden = true;
    $("remaining").textContent = m.remaining_steps === null ? "no step limit" : m.remaining_steps;
    // Only while a person drives: a sim paced to its learner may step slowly when nobody does.
    const slow = m.teleop_driver !== null && m.loop_hz > 0 && m.loop_hz < teleop.welcome.slow_loop_hz;
    $("loop-rate").textContent = `${m.loop_hz.toFixed(1)} steps/s`;
    $("slow-loop").hidden = !slow;
    $("slow-loop").textContent = slow ? `This robot steps ${m.loop_hz.toFixed(1)} times a second: too slow to drive ` +
      `smoothly (under ${teleop.welcome.slow_loop_hz}). Set fleet.control_hz (docs/people.md).` : "";
    const k = m.key_latency;
    $("key-latency").textContent = k ? `p50 ${k.p50_ms.toFixed(0)} ms, p99 ${k.p99_ms.toFixed(0)} ms over ${k.n} ` +
      `commands` + (k.left_out_estop ? ` (${k.left_out_estop} held by an e-stop left out)` : "") : "no command yet";
    showCommand(m);
    showObservation(m.observation || []);
  },
  applied(m) {
    const pressed = teleop.keyTimes.get(m.id);
    if (pressed === undefined) return;
    teleop.keyTimes.delete(m.id);
    const total = m.sent_at * 1000 - (pressed + teleop.clockOffset);
    teleop.latencies.push({id: m.id, total_ms: total, server_ms: (m.sent_at - m.received_at) * 1000});
    showLatency();
  },
  pong(m) {
    const rtt = now() - m.t;
    if (rtt <= teleop.bestRtt) { teleop.bestRtt = rtt; teleop.clockOffset = m.server - (m.t + rtt / 2); }
  },
  error(m) { say(m.message); },
  handed_back(m) { say(m.message); },  // the robot took itself back from an idle driver
  ok(m) {
    if (m.for === "estop") { teleop.estopPending = null; showConnection(); }
    if (m.for === "rearm") $("rearm-dialog").hidden = true;
    say(m.message || "");
  },
};

function ping() { send({type: "ping", t: now()}); }
setInterval(ping, 2000);

function quantile(sorted, q) { return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]; }

function showLatency() {
  const all = teleop.latencies.slice(-200).map((l) => l.total_ms).sort((a, b) => a - b);
  const last = teleop.latencies[teleop.latencies.length - 1].total_ms;
  $("latency").textContent = `${last.toFixed(0)} ms (p50 ${quantile(all, 0.5).toFixed(0)}, ` +
    `p99 ${quantile(all, 0.99).toFixed(0)} over ${all.length})`;
}

// What the robot is sent beside what its policy proposes (a person driving sees both), by name.
function showCommand(m) {
  const body = $("command").querySelector("tbody");
  const names = teleop.welcome.mapping.dimensions.map((d) => d.name);
  fillRows(body, names.map((name, i) => [name, fmt(m.action[i]), fmt(m.proposal[i])]));
  $("command").className = m.actor === "human" ? "driving-table" : "";
}

function showObservation(pairs) {
  $("observation").hidden = !pairs.length;
  fillRows($("observation").querySelector("tbody"), pairs.map(([name, value]) => [name, fmt(value)]));
}

function fmt(x) { return x === undefined ? "-" : x.toFixed(3); }

// Rows updated in place (10 times a second: no new elements each time).
function fillRows(body, rows) {
  while (body.rows.length > rows.length) body.deleteRow(-1);
  rows.forEach((cells, i) => {
    const tr = body.rows[i] || body.insertRow();
    cells.forEach((text, j) => { (tr.cells[j] || tr.insertCell()).textContent = text; });
  });
}

// -- views ----------------------------------------------------------------------------------------
function buildViews(cameras) {
  const views = $("views");
  views.textContent = cameras.length ? "" : "no camera: the robot's state is shown beside";
  for (const camera of cameras) {
    const figure = document.createElement("figure");
    const img = document.createElement("img");
    img.id = `view-${camera}`;
    img.alt = camera;
    const caption = document.createElement("figcaption");
    caption.textContent = camera;
    figure.append(img, caption);
    views.append(figure);
  }
}

// A frame: camera index (1 byte), captured at (float64 ms, robot clock), JPEG (server.py says so too).
function showFrame(buffer) {
  const camera = teleop.welcome.cameras[new Uint8Array(buffer, 0, 1)[0]];
  const img = $(`view-${camera}`);
  if (!img) return;
  const capturedAt = new DataView(buffer, 1, 8).getFloat64(0, true);
  const url = URL.createObjectURL(new Blob([buffer.slice(9)], {type: "image/jpeg"}));
  const old = img.src;
  img.onload = () => {
    if (old) URL.revokeObjectURL(old);
    const age = now() + teleop.clockOffset - capturedAt;  // camera -> screen, on the robot's clock
    const ages = teleop.frameAges[camera] || (teleop.frameAges[camera] = []);
    ages.push(age);
    if (ages.length > 200) ages.shift();
    const sorted = ages.slice().sort((a, b) => a - b);
    img.nextSibling.textContent = `${camera} · ${age.toFixed(0)} ms old (p50 ${quantile(sorted, 0.5).toFixed(0)}, ` +
      `p99 ${quantile(sorted, 0.99).toFixed(0)})`;
  };
  img.src = url;
  teleop.frames[camera] = (teleop.frames[camera] || 0) + 1;
}

document.addEventListener("DOMContentLoaded", connect);  // after input.js too (its handlers take the welcome)
