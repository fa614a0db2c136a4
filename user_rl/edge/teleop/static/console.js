// The fleet console: a tile per robot, fed by one websocket per robot straight to that robot's own
// page server (the robot page's protocol: welcome, state at 10 Hz, binary camera frames). Focusing a
// robot (a click, or its number key) shows that robot's own page beside the grid and gives it the
// keyboard, so every control there (take over, driving, labels, e-stop) is the robot page's own code.
// Stop all sends every robot an e-stop (again on reconnect until acknowledged); re-arming all needs
// an operator's credential and the "I checked the robots" tick, as a robot's page asks.
"use strict";

const params = new URLSearchParams(location.search);
const token = params.get("token") || "";
const person = params.get("name") || document.body.dataset.name || "operator";
const $ = (id) => document.getElementById(id);
const now = () => performance.timeOrigin + performance.now();  // wall clock, sub-millisecond
const STALE_MS = 3000;                                         // no message this long: reconnect
const BACKOFF_MS = [250, 500, 1000, 2000, 4000, 8000];
const AGES = 600;                                              // frame ages kept per robot

const fleetConsole = {links: [], focused: null, focusReady: false, person};
window.fleetConsole = fleetConsole;

class RobotLink {
  constructor(page) {
    Object.assign(this, {page, ws: null, welcome: null, state: null, connected: false, attempts: 0,
      lastMessage: 0, clockOffset: 0, bestRtt: Infinity, synced: false, views: {}, camera: "all",
      frames: 0, skipped: 0, ages: [], lastFrameAt: 0, lastAge: 0, estopPending: null});
    this.tile = buildTile(this);
    this.connect();
  }
  connect() {
    const url = new URL(this.page.address);
    const ws = new WebSocket(`${url.protocol === "https:" ? "wss" : "ws"}://${url.host}/ws?token=` +
      encodeURIComponent(this.page.token));
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    this.lastMessage = Date.now() + 2000;
    ws.onopen = () => {
      this.send({type: "hello", name: `console:${person}`});
      if (this.estopPending !== null) this.send({type: "estop"});  // stop all pressed while it was away
      this.ping();
    };
    ws.onclose = () => this.disconnected(ws);
    ws.onmessage = (event) => {
      if (ws !== this.ws) return;
      this.lastMessage = Date.now();
      if (typeof event.data !== "string") return this.frame(event.data);
      const message = JSON.parse(event.data);
      if (this[`on_${message.type}`]) this[`on_${message.type}`](message);
    };
  }
  disconnected(ws) {
    if (ws !== this.ws) return;
    ws.onclose = ws.onmessage = null;
    try { ws.close(); } catch (e) { /* closed already */ }
    this.ws = null;
    this.connected = false;
    const delay = BACKOFF_MS[Math.min(this.attempts, BACKOFF_MS.length - 1)] * (0.8 + 0.4 * Math.random());
    this.attempts += 1;
    this.say(`connection lost: reconnecting (attempt ${this.attempts})`);
    redraw();
    setTimeout(() => this.connect(), delay);
  }
  send(message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(message));
  }
  ping() { this.send({type: "ping", t: now()}); }
  say(text) { this.tile.querySelector(".message").textContent = text; }
  moved(page) {  // its edge restarted somewhere else (teleop.json is read again)
    this.page = page;
    if (this.ws) this.disconnected(this.ws);
  }
  on_welcome(m) {
    this.welcome = m;
    this.connected = true;
    this.attempts = 0;
    this.say("");
    buildViews(this);
  }
  on_state(m) { this.state = m; redraw(); }
  on_pong(m) {
    const rtt = now() - m.t;
    if (rtt <= this.bestRtt) { this.bestRtt = rtt; this.clockOffset = m.server - (m.t + rtt / 2); this.synced = true; }
  }
  on_ok(m) {
    if (m.for === "estop") { this.estopPending = null; redraw(); }
    if (m.message) this.say(m.message);
  }
  on_error(m) { this.say(m.message); }
  // A frame: camera index (1 byte), captured at (float64 ms, robot clock), JPEG. A camera's frame is
  // shown once the one before it is; one that comes meanwhile replaces the waiting one (`skipped`).
  frame(buffer) {
    const camera = this.welcome && this.welcome.cameras[new Uint8Array(buffer, 0, 1)[0]];
    const view = this.views[camera];
    if (!view) return;
    if (view.next) this.skipped += 1;
    view.next = {capturedAt: new DataView(buffer, 1, 8).getFloat64(0, true), jpeg: buffer.slice(9)};
    if (!view.loading) this.load(view);
  }
  load(view) {
    const {capturedAt, jpeg} = view.next;
    view.next = null;
    view.loading = true;
    const url = URL.createObjectURL(new Blob([jpeg], {type: "image/jpeg"}));
    const old = view.img.src;
    view.img.onload = view.img.onerror = (event) => {
      if (old) URL.revokeObjectURL(old);
      view.loading = false;
      if (event.type === "load") {
        this.frames += 1;
        const age = now() + this.clockOffset - capturedAt;  // camera -> screen, on the robot's clock
        this.lastAge = age;
        this.lastFrameAt = Date.now();
        if (this.synced) { this.ages.push(age); if (this.ages.length > AGES) this.ages.shift(); }
      }
      if (view.next) this.load(view);
    };
    view.img.src = url;
  }
}

// A silent socket is as good as closed. Silence counts only while the page itself runs (a page
// starved of CPU wakes before its queued messages, as the robot page's watchdog knows).
let lastWatchdog = Date.now();
setInterval(() => {
  const late = Date.now() - lastWatchdog - 500;
  lastWatchdog = Date.now();
  for (const link of fleetConsole.links) {
    if (late > 500) link.lastMessage += late;
    if (link.ws && Date.now() - link.lastMessage > STALE_MS) link.disconnected(link.ws);
  }
}, 500);
setInterval(() => fleetConsole.links.forEach((link) => link.ping()), 2000);

// -- the fleet: robots from /api/robots, stop all, re-arm all -------------------------------------
async function loadRobots() {
  try {
    const response = await fetch(`/api/robots?token=${encodeURIComponent(token)}`);
    const answer = await response.json();
    $("fleet-message").textContent = answer.error || "";
    for (const page of answer.robots) {
      const link = fleetConsole.links.find((l) => l.page.robot === page.robot);
      if (!link) fleetConsole.links.push(new RobotLink(page));
      else if (link.page.address !== page.address || link.page.token !== page.token) link.moved(page);
    }
    redraw();
  } catch (e) {
    $("fleet-message").textContent = `the console server does not answer (${e}); the robots' tiles go on`;
  }
}

function showFleet() {
  const links = fleetConsole.links;
  const stopped = links.filter((l) => l.state && l.state.estop);
  const away = links.filter((l) => !l.connected);
  $("fleet-summary").textContent = `${links.length} robots · ${stopped.length} stopped` +
    (away.length ? ` · ${away.length} not connected` : "");
  $("rearm-all").disabled = stopped.length === 0;
  const pending = links.filter((l) => l.estopPending !== null);
  $("fleet-status").textContent = pending.length ? "STOP NOT DELIVERED to " +
    `${pending.map((l) => l.page.robot).join(", ")}: sent when each reconnects; stop them another way now ` +
    "(user-rl estop, or their hardware stop)" :
    stopped.length ? `${stopped.length} of ${links.length} robots stopped` : "";
  $("fleet-status").className = pending.length ? "undelivered" : "";
}

function stopAll() {
  for (const link of fleetConsole.links) {
    if (link.estopPending === null) link.estopPending = Date.now();
    link.send({type: "estop"});
  }
  redraw();
}

$("stop-all").onclick = stopAll;
$("rearm-all").onclick = () => {
  const list = $("rearm-stops");
  list.textContent = "";
  for (const link of fleetConsole.links.filter((l) => l.state && l.state.estop)) {
    const item = document.createElement("li");
    const s = link.state;
    const by = `${s.estop_source}${s.estop_by ? ": " + s.estop_by : ""}`;
    item.textContent = `${link.page.robot}: ${s.estop} (set by the ${by})` +
      (s.estop_source === "page" ? "" : " — not from a page: re-arm it on its own page, typing its reason");
    list.append(item);
  }
  $("rearm-safe").checked = false;
  $("rearm-dialog").hidden = false;
};
$("rearm-cancel").onclick = () => { $("rearm-dialog").hidden = true; };
$("rearm-dialog").onsubmit = (event) => {
  event.preventDefault();
  if (!$("rearm-safe").checked) {
    $("fleet-message").textContent = "not re-armed: tick that you checked the robots first";
    return;
  }
  const credential = $("operator-credential").value;
  for (const link of fleetConsole.links) {
    const s = link.state;
    if (!s || !s.estop) continue;
    if (s.estop_source !== "page") {
      link.say("not re-armed: its stop was not set on a page (type its reason on its own page)");
      continue;
    }
    link.send({type: "rearm", credential, confirm: s.estop});  // the stop's reason: what the tick confirms
  }
  $("rearm-dialog").hidden = true;
  $("fleet-message").textContent = "re-arm sent: each robot's tile says whether it was re-armed";
};

// -- focus: the robot's own page beside the grid ---------------------------------------------------
function focusRobot(index) {
  const link = fleetConsole.links[index];
  if (!link) return;
  const frame = $("robot-page");
  $("focus").hidden = false;
  $("focus-title").textContent = `${index + 1}: ${link.page.robot}`;
  if (fleetConsole.focused === link.page.robot && fleetConsole.focusReady) {
    frame.contentWindow.focus();
  } else {
    fleetConsole.focused = link.page.robot;
    fleetConsole.focusReady = false;
    frame.onload = () => { fleetConsole.focusReady = true; frame.contentWindow.focus(); };
    frame.src = `${link.page.url}&name=${encodeURIComponent(person)}`;
  }
  redraw();
}
$("unfocus").onclick = () => {
  $("focus").hidden = true;
  $("robot-page").onload = null;
  $("robot-page").src = "about:blank";
  fleetConsole.focused = null;
  redraw();
};

// Keys on the console: 1-9 focus a robot; Escape stops them all. The focused robot's page has the
// keyboard and passes its digit keys up (postMessage), so 1-9 switch robots from there too.
function onKey(code) {
  const digit = /^(?:Digit|Numpad)([1-9])$/.exec(code);
  if (digit) { focusRobot(Number(digit[1]) - 1); return true; }
  return false;
}
window.addEventListener("keydown", (event) => {
  if (event.code === "Escape") { stopAll(); event.preventDefault(); return; }  // stopping is never wrong
  if (event.target instanceof HTMLInputElement || event.repeat) return;  // typing a credential
  if (onKey(event.code)) event.preventDefault();
});
window.addEventListener("message", (event) => {
  const m = event.data;
  if (event.source === $("robot-page").contentWindow && m && m.type === "user-rl-key") onKey(String(m.code));
});

// For tests and the curious: each robot's frame ages (camera -> screen, ms; the last AGES shown).
fleetConsole.frameAges = () => Object.fromEntries(fleetConsole.links.map((l) => [l.page.robot, l.ages.slice()]));
fleetConsole.clearAges = () => fleetConsole.links.forEach((l) => { l.ages = []; l.skipped = 0; });

loadRobots();
setInterval(loadRobots, 3000);
