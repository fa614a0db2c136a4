// What a person does on the robot's page, by keyboard, gamepad or mouse: drive (held keys, sticks),
// and every other action (take over / hand back, labels with a short undo window, discard, reset,
// e-stop, re-arm) by a key and a button too. The server's mapping names every binding; the page
// shows them as it uses them. Escape is the e-stop from anywhere on the page, a text field too.
"use strict";

// -- the bindings, shown --------------------------------------------------------------------------
function buildMapping(mapping) {
  const body = $("mapping").querySelector("tbody");
  body.textContent = "";
  for (const d of mapping.dimensions) {
    const pad = d.axis !== null ? `stick axis ${d.axis}${d.axis_sign < 0 ? " (up = +)" : ""}` :
      d.plus_button !== null ? `buttons ${d.plus_button} / ${d.minus_button}` : "-";
    body.append(row([d.name, d.plus_label, d.minus_label, pad]));
  }
  const keys = $("operator-keys").querySelector("tbody");
  keys.textContent = "";
  for (const k of mapping.operator) {
    keys.append(row([k.label, k.key_label, k.button === null ? "-" : `button ${k.button}`]));
    const button = document.querySelector(`[data-action="${k.action}"]`);
    if (button && !button.dataset.key) {
      button.dataset.key = k.key_label;
      button.textContent += ` [${k.key_label}]`;
    }
  }
}

function row(texts) {
  const tr = document.createElement("tr");
  for (const text of texts) {
    const cell = document.createElement("td");
    cell.textContent = text;
    tr.append(cell);
  }
  return tr;
}

// -- driving ----------------------------------------------------------------------------------------
function keyAction() {
  const {dimensions, speed} = teleop.welcome.mapping;
  return dimensions.map((d) => d.name === "gripper" ? teleop.gripper :
    ((teleop.held.has(d.plus_key) ? speed : 0) - (teleop.held.has(d.minus_key) ? speed : 0)));
}

// A new command carries when its key was pressed on the robot's clock: the robot measures key -> robot
// for everyone watching (server: latency.py); the driver's page also times it from the `applied` reply.
function sendCommand(pressedAt) {
  if (!teleop.driving || !teleop.welcome) return;
  const action = teleop.held.size || !teleop.gamepadAction ? keyAction() : teleop.gamepadAction;
  const same = teleop.lastAction && action.every((a, i) => a === teleop.lastAction[i]);
  if (same) return;
  teleop.commandId += 1;
  teleop.keyTimes.set(teleop.commandId, pressedAt);
  if (teleop.keyTimes.size > 500) teleop.keyTimes.delete(teleop.keyTimes.keys().next().value);
  teleop.lastAction = action;
  send({type: "command", id: teleop.commandId, action, pressed_at: pressedAt + teleop.clockOffset});
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

// -- a person's other actions -----------------------------------------------------------------------
// A mark, reset or discard names the episode and step shown: it never lands on the next episode.
function request(message, shown = teleop.state) {
  if (!shown) return;
  say(`${message.type} sent for episode ${shown.episode} (step ${shown.step})…`);
  send({...message, episode: shown.episode, step: shown.step});
}

// A label waits `label_undo_s` before it is sent (undo takes it back meanwhile); it goes at once when
// the episode would end before that, since a label for an ended episode is refused.
function label(success) {
  const s = teleop.state;
  if (!s || !teleop.welcome) return;
  cancelLabel(false);
  const wait = teleop.welcome.label_undo_s * 1000;
  const stepsLeft = s.remaining_steps === null ? Infinity : s.remaining_steps;
  const endsFirst = s.loop_hz > 0 && stepsLeft / s.loop_hz * 1000 < wait + 500;
  const message = {type: "mark", success};
  if (wait <= 0 || endsFirst) return request(message, s);
  const shown = {episode: s.episode, step: s.step};
  const due = Date.now() + wait;
  teleop.pendingLabel = {success, shown, due, timer: setTimeout(() => { teleop.pendingLabel = null; showPending();
    request(message, shown); }, wait)};
  showPending();
}

function cancelLabel(tell = true) {
  const pending = teleop.pendingLabel;
  if (!pending) return;
  clearTimeout(pending.timer);
  teleop.pendingLabel = null;
  teleop.labelsUndone += 1;
  showPending();
  if (tell) say(`${pending.success ? "success" : "failure"} undone: nothing was sent`);
}

function showPending() {
  const p = teleop.pendingLabel;
  $("pending-label").hidden = !p;
  if (p) $("pending-label").textContent = `${p.success ? "success" : "failure"} for episode ${p.shown.episode} is ` +
    `sent in ${Math.max(0, (p.due - Date.now()) / 1000).toFixed(1)} s: Z (gamepad X) undoes it`;
}
setInterval(() => { if (teleop.pendingLabel) showPending(); }, 100);

function takeOverOrHandBack() {
  if (teleop.driving) { teleop.held.clear(); send({type: "hand_back"}); }
  else { teleop.lastAction = null; send({type: "take_over"}); }
}

function openRearm() {
  const s = teleop.state;
  if (!s || !s.estop) return say("the robot is not stopped: nothing to re-arm");
  if (!teleop.welcome.operators) return say($("rearm").title);
  const fromPage = s.estop_source === "page";
  $("rearm-stop").textContent = `${s.estop} (set by the ${s.estop_source}${s.estop_by ? ": " + s.estop_by : ""})`;
  $("rearm-safe-row").hidden = !fromPage;
  $("rearm-reason-row").hidden = fromPage;
  $("rearm-safe").checked = false;
  $("rearm-reason").value = "";
  $("rearm-dialog").hidden = false;
  $(fromPage ? "rearm-safe" : "rearm-reason").focus();  // then Tab to the credential, Enter re-arms
}

const actions = {
  take_over: takeOverOrHandBack,
  hand_back: () => { if (teleop.driving) takeOverOrHandBack(); },
  success: () => label(true),
  failure: () => label(false),
  undo: () => teleop.pendingLabel ? cancelLabel() : say("no label waiting to be sent: nothing to undo"),
  discard: () => request({type: "discard"}),
  reset: () => request({type: "reset"}),
  estop: pressEstop,
  rearm: openRearm,
};

function operatorAction(code) {
  if (code === "NumpadEnter") code = "Enter";
  const binding = teleop.welcome && teleop.welcome.mapping.operator.find((k) => k.key === code);
  return binding ? binding.action : null;
}

// -- keys -------------------------------------------------------------------------------------------
window.addEventListener("keydown", (event) => {
  const action = operatorAction(event.code);
  if (action === "estop") { event.preventDefault(); return pressEstop(); }  // like a physical button: anywhere
  const typing = event.target instanceof HTMLInputElement || event.target instanceof HTMLTextAreaElement;
  if (typing) return;
  if (/^Digit[0-9]$/.test(event.code) && window.parent !== window) {  // on the fleet console: it picks the robot
    window.parent.postMessage({type: "user-rl-key", code: event.code}, "*");
    return;
  }
  if (action && !event.repeat && !event.ctrlKey && !event.metaKey && !event.altKey) {
    event.preventDefault();
    if (teleop.connected) actions[action]();
    return;
  }
  if (!mappedKey(event.code)) return;
  event.preventDefault();
  if (event.repeat || teleop.held.has(event.code)) return;
  teleop.held.add(event.code);
  const gripper = teleop.welcome.mapping.dimensions.find((d) => d.name === "gripper");
  if (gripper && event.code === gripper.plus_key) teleop.gripper = 1;
  if (gripper && event.code === gripper.minus_key) teleop.gripper = -1;
  sendCommand(performance.timeOrigin + event.timeStamp);
});

window.addEventListener("keyup", (event) => {
  const typing = event.target instanceof HTMLInputElement || event.target instanceof HTMLTextAreaElement;
  if (operatorAction(event.code) && !typing) event.preventDefault();  // Space must not also click a button
  if (!teleop.held.delete(event.code)) return;
  event.preventDefault();
  sendCommand(performance.timeOrigin + event.timeStamp);
});

window.addEventListener("blur", () => { teleop.held.clear(); sendCommand(now()); });  // keys let go elsewhere

// -- gamepad ----------------------------------------------------------------------------------------
const padPressed = new Set();  // operator buttons down at the last poll: an action fires on the press only

function pollGamepad() {
  const pad = [...(navigator.getGamepads ? navigator.getGamepads() : [])].find((p) => p);
  if (pad && teleop.welcome) {
    const {dimensions, operator} = teleop.welcome.mapping;
    const deadzone = (v) => Math.abs(v) < 0.15 ? 0 : Math.round(v * 20) / 20;
    const pressed = (i) => i !== null && pad.buttons[i] ? pad.buttons[i].value : 0;
    for (const k of operator) {
      if (k.button === null) continue;
      const down = pressed(k.button) > 0.5;
      if (down && !padPressed.has(k.button) && (teleop.connected || k.action === "estop")) actions[k.action]();
      if (down) padPressed.add(k.button); else padPressed.delete(k.button);
    }
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

// -- buttons (each also has its key: the mapping above) ---------------------------------------------
for (const button of document.querySelectorAll("[data-action]")) {
  button.onclick = () => actions[button.dataset.action]();
}
$("offline-estop").onclick = pressEstop;
// Re-arming: an operator's credential, and a confirmation of the stop cleared (its reason, typed
// for a stop set from the robot's controller or its watchdog).
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
