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
  const byState = new Set(["take-over", "hand-back", "mark-success", "mark-failure", "reset", "rearm"]);
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
    for (const id of ["mark-success", "mark-failure", "reset"]) $(id).disabled = someoneElse || m.episode_ended;
    $("estop-banner").hidden = !m.estop;
    $("estop-banner").textContent = m.estop ? `EMERGENCY STOP: ${m.estop} (set by the ${m.estop_source}` +
      `${m.estop_by ? ": " + m.estop_by : ""})` : "";
    $("rearm").disabled = !m.estop || !teleop.welcome.operators;
    $("rearm").title = teleop.welcome.operators ? "needs an operator credential" :
      "no operators for this robot: re-arm with user-rl rearm on its controller";
    if (!m.estop) $("rearm-dialog").hidden = true;
    if (m.observation) {
      $("observation").hidden = false;
      $("observation").textContent = JSON.stringify(m.observation, null, 1);
    }
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

// -- controls -------------------------------------------------------------------------------------
function buildMapping(mapping) {
  const body = $("mapping").querySelector("tbody");
  body.textContent = "";
  for (const d of mapping.dimensions) {
    const row = document.createElement("tr");
    const pad = d.axis !== null ? `stick axis ${d.axis}${d.axis_sign < 0 ? " (up = +)" : ""}` :
      d.plus_button !== null ? `buttons ${d.plus_button} / ${d.minus_button}` : "-";
    for (const text of [d.name, d.plus_label, d.minus_label, pad]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.append(cell);
    }
    body.append(row);
  }
}

function keyAction() {
  const {dimensions, speed} = teleop.welcome.mapping;
  return dimensions.map((d) => d.name === "gripper" ? teleop.gripper :
    ((teleop.held.has(d.plus_key) ? speed : 0) - (teleop.held.has(d.minus_key) ? speed : 0)));
}

function sendCommand(pressedAt) {
  if (!teleop.driving || !teleop.welcome) return;
  const action = teleop.held.size || !teleop.gamepadAction ? keyAction() : teleop.gamepadAction;
  const same = teleop.lastAction && action.every((a, i) => a === teleop.lastAction[i]);
  if (same) return;
  teleop.commandId += 1;
  teleop.keyTimes.set(teleop.commandId, pressedAt);
  if (teleop.keyTimes.size > 500) teleop.keyTimes.delete(teleop.keyTimes.keys().next().value);
  teleop.lastAction = action;
  send({type: "command", id: teleop.commandId, action});
}

// A held command is refreshed, so that a page that freezes stops the robot (command_timeout_s).
setInterval(() => {
  if (teleop.driving && teleop.lastAction && teleop.lastAction.some((a) => a !== 0)) {
    send({type: "command", id: teleop.commandId, action: teleop.lastAction});
  }
}, 100);

function mappedKey(code) {
  return teleop.welcome && teleop.welcome.mapping.dimensions.some((d) => d.plus_key === code || d.minus_key === code);
}

window.addEventListener("keydown", (event) => {
  if (!mappedKey(event.code) || event.target instanceof HTMLInputElement) return;  // typing is not driving
  event.preventDefault();
  if (event.repeat || teleop.held.has(event.code)) return;
  teleop.held.add(event.code);
  const gripper = teleop.welcome.mapping.dimensions.find((d) => d.name === "gripper");
  if (gripper && event.code === gripper.plus_key) teleop.gripper = 1;
  if (gripper && event.code === gripper.minus_key) teleop.gripper = -1;
  sendCommand(performance.timeOrigin + event.timeStamp);
});

window.addEventListener("keyup", (event) => {
  if (!teleop.held.delete(event.code)) return;
  event.preventDefault();
  sendCommand(performance.timeOrigin + event.timeStamp);
});

window.addEventListener("blur", () => { teleop.held.clear(); sendCommand(now()); });  // keys let go elsewhere

function pollGamepad() {
  const pad = [...(navigator.getGamepads ? navigator.getGamepads() : [])].find((p) => p);
  if (pad && teleop.welcome) {
    const {dimensions} = teleop.welcome.mapping;
    const deadzone = (v) => Math.abs(v) < 0.15 ? 0 : Math.round(v * 20) / 20;
    const pressed = (i) => i !== null && pad.buttons[i] ? pad.buttons[i].value : 0;
    const action = dimensions.map((d) => d.axis !== null ? deadzone((pad.axes[d.axis] || 0) * d.axis_sign) :
      deadzone(pressed(d.plus_button) - pressed(d.minus_button)));
    const moved = action.some((a) => a !== 0);
    if (moved || teleop.gamepadAction) {
      teleop.gamepadAction = moved ? action : null;
      sendCommand(now());
    }
  }
  requestAnimationFrame(pollGamepad);
}
requestAnimationFrame(pollGamepad);

$("take-over").onclick = () => { teleop.lastAction = null; send({type: "take_over"}); };
$("hand-back").onclick = () => { teleop.held.clear(); send({type: "hand_back"}); };
// A mark or reset names the episode and step shown: it never lands on the next episode.
function request(message) {
  const s = teleop.state;
  if (!s) return;
  say(`${message.type} sent for episode ${s.episode} (step ${s.step})…`);
  send({...message, episode: s.episode, step: s.step});
}
$("mark-success").onclick = () => request({type: "mark", success: true});
$("mark-failure").onclick = () => request({type: "mark", success: false});
$("reset").onclick = () => request({type: "reset"});
$("estop").onclick = pressEstop;
$("offline-estop").onclick = pressEstop;
// Re-arming: an operator's credential, and a confirmation of the stop cleared (its reason, typed
// for a stop set from the robot's controller or its watchdog).
$("rearm").onclick = () => {
  const s = teleop.state;
  if (!s || !s.estop) return;
  const fromPage = s.estop_source === "page";
  $("rearm-stop").textContent = `${s.estop} (set by the ${s.estop_source}${s.estop_by ? ": " + s.estop_by : ""})`;
  $("rearm-safe-row").hidden = !fromPage;
  $("rearm-reason-row").hidden = fromPage;
  $("rearm-safe").checked = false;
  $("rearm-reason").value = "";
  $("rearm-dialog").hidden = false;
};
$("rearm-cancel").onclick = () => { $("rearm-dialog").hidden = true; };
$("rearm-dialog").onsubmit = (event) => {
  event.preventDefault();
  const s = teleop.state;
  if (!s || !s.estop) return;
  const fromPage = s.estop_source === "page";
  if (fromPage && !$("rearm-safe").checked) return say("tick that the robot is safe to move first");
  send({type: "rearm", credential: $("operator-credential").value,
        confirm: fromPage ? s.estop : $("rearm-reason").value});
};
for (const [id, value] of [["gripper-close", 1], ["gripper-open", -1]]) {
  $(id).onclick = () => { teleop.gripper = value; sendCommand(now()); };
}

connect();
