// The fleet console's tiles (console.js feeds them): one per robot, with its cameras, its frame age
// and its state, as its page's state messages and the tile fields beside them (tiles.py) say.
"use strict";

const quantile = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
const pct = (x) => `${Math.round(100 * x)}%`;

// Tiles are drawn at most every REDRAW_MS, not on each of the robots' state messages (8 robots: 80 a
// second), and only what changed is written: the page's main thread also shows every camera frame.
const REDRAW_MS = 200;
let redrawDue = false;
function redraw() {
  if (redrawDue) return;
  redrawDue = true;
  setTimeout(() => { redrawDue = false; fleetConsole.links.forEach(showTile); showFleet(); }, REDRAW_MS);
}

function buildTile(link) {
  const tile = document.createElement("article");
  tile.className = "tile offline";
  tile.innerHTML = `<header><span class="number"></span><span class="name"></span><select hidden></select></header>
    <div class="stop-banner" hidden></div><div class="body"><div class="views"></div><dl>
    <dt>acting</dt><dd class="acting">-</dd><dt>episode</dt><dd class="episode">-</dd>
    <dt title="labelled success, of its last labelled episodes">success</dt><dd class="success">-</dd>
    <dt title="steps a person or the scripted expert acted, of its last steps">interv.</dt>
    <dd class="interventions">-</dd>
    <dt title="its data link to the learner; batches not yet acknowledged as stored">link</dt><dd class="link">-</dd>
    <dt title="the version it acts with; versions the learner published since">policy</dt><dd class="policy">-</dd>
    <dt title="camera -> screen: the newest frame's age, p99 of the last 100">frame</dt><dd class="frame-age">-</dd>
    </dl></div><p class="message"></p>`;
  tile.querySelector(".name").textContent = link.page.robot;
  tile.querySelector("select").onchange = (event) => { link.camera = event.target.value; showViews(link); };
  tile.querySelector("select").onclick = (event) => event.stopPropagation();
  tile.onclick = () => focusRobot(fleetConsole.links.indexOf(link));
  $("grid").append(tile);
  return tile;
}

function buildViews(link) {
  const views = link.tile.querySelector(".views");
  views.textContent = link.welcome.cameras.length ? "" : "no camera";
  link.views = {};
  for (const camera of link.welcome.cameras) {
    const figure = document.createElement("figure");
    const img = document.createElement("img");
    img.alt = camera;
    const caption = document.createElement("figcaption");
    caption.textContent = camera;
    figure.append(img, caption);
    views.append(figure);
    link.views[camera] = {img, figure, next: null, loading: false};
  }
  const select = link.tile.querySelector("select");
  select.hidden = link.welcome.cameras.length < 2;
  select.textContent = "";
  for (const choice of ["all", ...link.welcome.cameras]) select.add(new Option(choice, choice));
  if (!(link.camera in link.views)) link.camera = "all";
  select.value = link.camera;
  showViews(link);
}

function showViews(link) {
  const all = link.camera === "all";
  link.tile.querySelector(".views").classList.toggle("all", all && Object.keys(link.views).length > 1);
  for (const [camera, view] of Object.entries(link.views)) view.figure.hidden = !all && camera !== link.camera;
}

function showTile(link) {
  const {tile, state: s} = link;
  const set = (cls, text, bad = false) => {
    const el = tile.querySelector(`.${cls}`);
    if (el.textContent !== text) el.textContent = text;
    if (el.classList.contains("bad") !== bad) el.classList.toggle("bad", bad);
  };
  const index = fleetConsole.links.indexOf(link);
  tile.querySelector(".number").textContent = index < 9 ? index + 1 : "";  // keys 1-9
  tile.classList.toggle("offline", !link.connected);
  tile.classList.toggle("focused", fleetConsole.focused === link.page.robot);
  const stopped = Boolean(s && s.estop);
  const banner = tile.querySelector(".stop-banner");
  banner.hidden = !stopped && link.estopPending === null;
  banner.textContent = stopped ? `STOPPED: ${s.estop}` : "STOP NOT DELIVERED YET";
  tile.classList.toggle("stopped", stopped);
  if (!s) return;
  const acting = {policy: "policy", warmup: "warm-up (random)", human: "person", scripted: "scripted"}[s.actor];
  set("acting", stopped ? "nobody (stopped)" : s.teleop_driver ? `person: ${s.teleop_driver}` : acting || s.actor);
  tile.querySelector(".acting").classList.toggle("driving", Boolean(s.teleop_driver));
  set("episode", `${s.episode}, step ${s.episode_steps}${s.episode_limit ? `/${s.episode_limit}` : ""}`);
  set("success", s.success_rate === null || s.success_rate === undefined ? "none labelled" :
    `${pct(s.success_rate)} of ${s.success_of} ep.`);
  set("interventions", s.intervention_rate === null || s.intervention_rate === undefined ? "-" :
    `${pct(s.intervention_rate)} of ${s.intervention_of} steps`);
  if (s.link) set("link", `${s.link.state} · ${s.link.backlog} unacked`, s.link.state !== "ok");
  if (s.policy) {
    set("policy", s.policy.lag === null ? "none yet" : `v${s.policy.acting} · ${s.policy.lag} behind`,
      s.policy.lag !== null && s.policy.lag > 1);
  }
  const ages = link.ages.slice(-100).sort((a, b) => a - b);
  const silent = (Date.now() - link.lastFrameAt) / 1000;
  if (!Object.keys(link.views).length) set("frame-age", "no camera");
  else if (!link.lastFrameAt || silent > 2) {
    set("frame-age", link.lastFrameAt ? `none for ${silent.toFixed(0)} s` : "none yet", true);
  }
  else if (ages.length) set("frame-age", `${Math.round(link.lastAge)} ms (p99 ${Math.round(quantile(ages, 0.99))})`);
}
