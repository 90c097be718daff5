// The review desk page (airflow_batchinfer/review/app.py serves it). Plain JavaScript, no build step,
// nothing fetched from anywhere but this app.
//
// Safety rule: every text that comes from storage or from Airflow (model output, prompts, reasons,
// ids, subjects, notes) is put into the page as a text node (el() / textContent), never parsed as
// HTML and never rendered as markdown. Do not add HTML parsing sinks to this file (a unit test
// forbids them).
//
// Every URL is relative: the page sits under [api] base_url's path, in an iframe of the Airflow UI.
"use strict";

(function () {
  const API = "../api/";
  const UI_BASE = new URL("../../", window.location.href); // the Airflow UI, from <base>/batchinfer/review/
  const query = new URLSearchParams(window.location.search);
  const dagId = query.get("dag_id");
  const runId = query.get("run_id");
  const app = document.getElementById("app");
  const statusLine = document.getElementById("status");

  // ------------------------------------------------------------------------------ the theme
  // Light or dark as the Airflow UI around the page is: its <html> carries the class "light" or
  // "dark" (next-themes, storage key "theme", same origin: the page is its iframe); opened on its
  // own, the UI's stored choice; else (and for "system") the browser's prefers-color-scheme, in CSS.
  function hostTheme() {
    const host = hostWindow();
    if (host) {
      const classes = host.document.documentElement.classList;
      if (classes.contains("dark")) return "dark";
      if (classes.contains("light")) return "light";
    }
    try {
      const stored = window.localStorage.getItem("theme");
      if (stored === "dark" || stored === "light") return stored;
    } catch (e) {
      // storage refused: the browser's preference
    }
    return null;
  }

  function applyTheme() {
    const theme = hostTheme();
    if (theme) document.documentElement.setAttribute("data-theme", theme);
    else document.documentElement.removeAttribute("data-theme");
  }

  function followTheme() {
    applyTheme();
    window.addEventListener("storage", (event) => {
      if (event.key === "theme") applyTheme();
    });
    const host = hostWindow();
    if (host && host.MutationObserver) {
      new host.MutationObserver(applyTheme).observe(host.document.documentElement, { attributes: true, attributeFilter: ["class"] });
    }
  }

  // ---------------------------------------------------------------------------- helpers
  // el("div", {class: "x", "data-testid": "y"}, child, "text", ...): strings become text nodes.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on")) throw new Error("no event attributes: use addEventListener");
      node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function asText(value) {
    if (value === null || value === undefined) return "";
    if (typeof value === "string") return value;
    return JSON.stringify(value, null, 2);
  }

  function say(message, kind) {
    statusLine.textContent = message || "";
    statusLine.className = "status" + (kind ? " " + kind : "");
  }

  async function api(path, options) {
    const init = Object.assign({ credentials: "same-origin", headers: { Accept: "application/json" } }, options || {});
    if (init.body !== undefined) {
      init.headers = Object.assign({ "Content-Type": "application/json" }, init.headers);
      init.body = JSON.stringify(init.body);
    }
    const response = await fetch(API + path, init);
    let data = null;
    try {
      data = await response.json();
    } catch (e) {
      data = null;
    }
    if (!response.ok) {
      let detail = data && data.detail !== undefined ? data.detail : response.statusText;
      if (response.status === 401) detail = "Not signed in to Airflow (" + asText(detail) + ")";
      const error = new Error(asText(detail));
      error.status = response.status;
      throw error;
    }
    return data;
  }

  function gatePath(suffix) {
    return "gates/" + encodeURIComponent(dagId) + "/" + encodeURIComponent(runId) + (suffix || "");
  }

  function params(values) {
    const p = new URLSearchParams();
    for (const [key, value] of Object.entries(values)) {
      if (value !== null && value !== undefined && value !== "") p.set(key, String(value));
    }
    const s = p.toString();
    return s ? "?" + s : "";
  }

  // The Airflow UI around this page, when the page is its "Review desk" tab (a same-origin iframe
  // whose sandbox allows no top navigation); null when the page is opened on its own.
  function hostWindow() {
    try {
      if (window.top === window || window.top.location.origin !== window.location.origin) return null;
      return window.top;
    } catch (e) {
      return null; // another origin
    }
  }

  // A link to a page of the Airflow UI. Inside the UI's iframe a plain click would load a second
  // Airflow UI inside the frame (and the sandbox forbids navigating the top window), so the click
  // moves the UI itself there: a history entry its router follows, as its own links do.
  function uiLink(href, attrs, text) {
    const link = el("a", Object.assign({ href: href }, attrs), text);
    link.addEventListener("click", (event) => {
      const host = hostWindow();
      if (!host || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
      event.preventDefault();
      const target = new URL(href);
      host.history.pushState(null, "", target.pathname + target.search + target.hash);
      host.dispatchEvent(new PopStateEvent("popstate", { state: null }));
    });
    return link;
  }

  function requiredActionsLink(gate) {
    return uiLink(
      new URL(gate.required_actions_path, UI_BASE).href,
      { "data-testid": "required-actions-link" },
      "Answer the gate (Continue / Stop) on its Required Actions page",
    );
  }

  // ------------------------------------------------------------------------- the gate list
  async function showGateList() {
    document.title = "Review desk: open gates";
    say("Loading the open review gates…");
    const data = await api("gates");
    clear(app);
    app.appendChild(el("h2", {}, "Open review gates"));
    if (!data.gates.length) {
      app.appendChild(el("p", { "data-testid": "no-gates" }, "No review gate is waiting."));
      say("");
      return;
    }
    const rows = data.gates.map((gate) =>
      el(
        "tr",
        { "data-testid": "gate-row" },
        el("td", {}, el("a", { href: "./" + params({ dag_id: gate.dag_id, run_id: gate.run_id }), "data-testid": "gate-link" }, gate.dag_id)),
        el("td", {}, gate.run_id),
        el("td", {}, gate.task_id),
        el("td", {}, gate.round === null ? "?" : String(gate.round)),
        el("td", {}, gate.title || gate.subject),
        el("td", {}, gate.created_at || ""),
        el("td", {}, gate.assigned_users.map((u) => u.name).join(", ") || "anyone who may answer"),
        el("td", {}, gate.error ? el("span", { class: "error" }, gate.error) : ""),
      ),
    );
    app.appendChild(
      el(
        "table",
        { class: "grid", "data-testid": "gates" },
        el("thead", {}, el("tr", {}, ["DAG", "run", "gate", "round", "subject", "opened", "assigned to", ""].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows),
      ),
    );
    say("");
  }

  // --------------------------------------------------------------------------- one gate
  const state = {
    gate: null,
    round: null,
    open: false,
    calibrated: true, // the judge against the reviewers is shown (not for a human judge)
    mode: "sample", // or "browse"
    group: "",
    text: "",
    seed: 0,
    n: 20,
    size: 50,
    cursors: [null], // the cursor of each page seen; the last one is the page shown
    next: null,
    samples: [],
    selected: new Map(), // JSON of the id -> the id
    bulkArmed: false,
  };
  const parts = {};

  function section(title, testid, ...children) {
    return el("section", { "data-testid": testid }, el("h2", {}, title), ...children);
  }

  async function showGate() {
    document.title = "Review desk: " + dagId + " / " + runId;
    say("Loading the gate…");
    const info = await api(gatePath(""));
    // the run's name, its round and its DAG: never a storage path
    const name = info.gate.run_name || runId;
    document.title = "Review desk: " + name + (info.round === null ? "" : " · round " + info.round) + " · " + dagId;
    state.gate = info.gate;
    state.round = info.round;
    state.open = info.gate.open;
    state.calibrated = info.calibrated !== false; // people as the judge: nothing to calibrate
    clear(app);

    const gate = info.gate;
    app.appendChild(
      el(
        "section",
        { class: "gate", "data-testid": "gate" },
        el("h2", { "data-testid": "gate-subject" }, gate.title || gate.subject),
        el(
          "dl",
          {},
          el("dt", {}, "DAG run"),
          el("dd", { "data-testid": "gate-run" }, dagId + " / " + runId),
          el("dt", {}, "run name"),
          el("dd", { "data-testid": "gate-run-name" }, name),
          el("dt", {}, "gate"),
          el("dd", {}, gate.task_id + (gate.open ? " (waiting)" : " (answered or closed)")),
          el("dt", {}, "round under review"),
          el("dd", { "data-testid": "gate-round" }, info.round === null ? "none closed yet" : String(info.round)),
          el("dt", {}, "run root"),
          el("dd", { class: "mono" }, info.run_root),
          el("dt", {}, "may decide"),
          el("dd", {}, gate.assigned_users.map((u) => u.name).join(", ") || "anyone who may answer the gate"),
        ),
        el("p", {}, requiredActionsLink(gate)),
      ),
    );
    if (info.round === null) {
      app.appendChild(shardsSection());
      await loadShards();
      say("No round has closed yet: nothing to review.");
      return;
    }

    parts.counts = el("div", { class: "counts", "data-testid": "counts" });
    parts.trend = el("img", {
      src: API + gatePath("/trend.svg"),
      alt: "Records pending and approved per round, and the approval rate",
      class: "trend",
      "data-testid": "trend-plot",
    });
    app.appendChild(section("Round " + info.round, "summary", parts.counts, parts.trend));
    if (state.calibrated) app.appendChild(calibrationSection());

    parts.groups = el("div", { class: "groups", "data-testid": "groups" });
    parts.text = el("input", { type: "search", placeholder: "text in prompt, output, reason or id", maxlength: "200", "data-testid": "search-text" });
    const searchButton = el("button", { type: "submit", "data-testid": "search-button" }, "Search");
    const clearButton = el("button", { type: "button", "data-testid": "clear-filter" }, "Clear filter");
    const searchForm = el("form", { class: "search", "data-testid": "search-form" }, parts.text, searchButton, clearButton);
    parts.filterLine = el("p", { class: "filter", "data-testid": "filter" });
    app.appendChild(section("Reasons and search", "filters", parts.groups, searchForm, parts.filterLine));
    searchForm.addEventListener("submit", (event) => {
      event.preventDefault();
      setFilter(state.group, parts.text.value.trim());
    });
    clearButton.addEventListener("click", () => {
      parts.text.value = "";
      setFilter("", "");
    });

    parts.seed = el("input", { type: "number", min: "0", step: "1", value: String(state.seed), "data-testid": "sample-seed" });
    parts.n = el("input", { type: "number", min: "1", max: "200", step: "1", value: String(state.n), "data-testid": "sample-size" });
    const sampleButton = el("button", { type: "button", "data-testid": "sample-button" }, "Draw a random sample");
    const browseButton = el("button", { type: "button", "data-testid": "browse-button" }, "Browse all (filtered)");
    parts.prev = el("button", { type: "button", "data-testid": "page-prev" }, "← Previous");
    parts.next = el("button", { type: "button", "data-testid": "page-next" }, "Next →");
    parts.pageInfo = el("span", { class: "page-info", "data-testid": "page-info" });
    parts.size = el(
      "select",
      { "data-testid": "page-size", title: "samples per page" },
      [10, 20, 50, 100, 200].map((n) => el("option", { value: String(n), selected: n === state.size }, n + " per page")),
    );
    parts.selectAll = el("input", { type: "checkbox", "data-testid": "select-all", title: "select every sample shown" });
    parts.samples = el("tbody", { "data-testid": "samples" });
    app.appendChild(
      section(
        "Samples",
        "samples-section",
        el(
          "div",
          { class: "controls" },
          el("label", {}, "seed ", parts.seed),
          el("label", {}, "how many ", parts.n),
          sampleButton,
          browseButton,
          parts.size,
          parts.prev,
          parts.next,
          parts.pageInfo,
        ),
        el("p", { class: "hint", "data-testid": "focus-hint" }, "Click a row, or press Enter on it, to review its samples one at a time (the focus view; ? lists its keys)."),
        el(
          "table",
          { class: "grid samples" },
          el(
            "thead",
            {},
            el("tr", {}, el("th", {}, parts.selectAll), ["id", "verdict", "reason", "score", "attempts", "prompt", "output"].map((h) => el("th", {}, h))),
          ),
          parts.samples,
        ),
      ),
    );
    sampleButton.addEventListener("click", () => {
      state.mode = "sample";
      state.seed = Math.max(0, parseInt(parts.seed.value, 10) || 0);
      state.n = Math.min(200, Math.max(1, parseInt(parts.n.value, 10) || 20));
      loadSamples().catch(fail);
    });
    browseButton.addEventListener("click", () => {
      state.mode = "browse";
      state.cursors = [null];
      loadSamples().catch(fail);
    });
    parts.size.addEventListener("change", () => {
      state.size = parseInt(parts.size.value, 10) || 50;
      state.mode = "browse";
      state.cursors = [null];
      loadSamples().catch(fail);
    });
    parts.prev.addEventListener("click", () => {
      if (state.cursors.length > 1) state.cursors.pop();
      loadSamples().catch(fail);
    });
    parts.next.addEventListener("click", () => {
      if (state.next === null) return;
      state.cursors.push(state.next);
      loadSamples().catch(fail);
    });
    parts.selectAll.addEventListener("change", () => {
      for (const sample of state.samples) {
        const key = JSON.stringify(sample.id);
        if (parts.selectAll.checked) state.selected.set(key, sample.id);
        else state.selected.delete(key);
      }
      renderSamples();
    });

    // decisions
    parts.note = el("textarea", { rows: "2", maxlength: "2000", placeholder: "note (optional)", "data-testid": "decision-note" });
    parts.selection = el("span", { class: "selection", "data-testid": "selection-count" });
    const buttons = ["accept", "retry", "drop"].map((action) => {
      const button = el("button", { type: "button", class: "decide " + action, "data-testid": "decide-" + action }, label(action) + " selected");
      button.addEventListener("click", () => decide(action, false).catch(fail));
      return button;
    });
    parts.bulkAction = el(
      "select",
      { "data-testid": "bulk-action" },
      ["accept", "retry", "drop"].map((action) => el("option", { value: action }, label(action))),
    );
    parts.bulk = el("button", { type: "button", "data-testid": "decide-bulk" }, "Apply to all matching the filter");
    parts.bulkConfirm = el("button", { type: "button", class: "confirm", hidden: true, "data-testid": "decide-bulk-confirm" }, "Confirm");
    parts.bulkCancel = el("button", { type: "button", hidden: true, "data-testid": "decide-bulk-cancel" }, "Cancel");
    parts.bulkWhat = el("span", { class: "bulk-what", "data-testid": "bulk-what" });
    parts.bulk.addEventListener("click", () => armBulk(true));
    parts.bulkCancel.addEventListener("click", () => armBulk(false));
    parts.bulkConfirm.addEventListener("click", () => decide(parts.bulkAction.value, true).catch(fail));
    parts.decisions = el("tbody", { "data-testid": "decisions" });
    parts.tally = el("div", { class: "tally", "data-testid": "tally" });
    parts.decideControls = [...buttons, parts.bulkAction, parts.bulk, parts.bulkConfirm, parts.note];
    app.appendChild(
      section(
        "Decisions",
        "decisions-section",
        el(
          "p",
          { class: "hint" },
          "Accept takes the samples as they are, Retry sends them to the next round, Drop leaves them out. ",
          "Decisions are recorded for the gate's round; answer the gate on its Required Actions page to go on.",
        ),
        el("div", { class: "controls" }, parts.note),
        el("div", { class: "controls" }, buttons, parts.selection),
        el("div", { class: "controls" }, parts.bulkAction, parts.bulk, parts.bulkWhat, parts.bulkConfirm, parts.bulkCancel),
        parts.tally,
        el(
          "table",
          { class: "grid" },
          el("thead", {}, el("tr", {}, ["when", "by", "action", "what", "note"].map((h) => el("th", {}, h)))),
          parts.decisions,
        ),
      ),
    );
    if (!state.open) {
      for (const control of parts.decideControls) control.disabled = true;
      parts.bulkWhat.textContent = "The gate is not waiting: decisions are closed.";
    }
    app.appendChild(shardsSection());

    await Promise.all([loadSummary(), loadSamples(), loadDecisions(), loadShards(), loadCalibration()]);
    say("");
  }

  // -------------------------------------------------------------------- the calibration
  // The judge against the reviewers: for the round under review, live as decisions are recorded
  // (only decisions naming samples count; a decision by filter is a rule, not a look at each one),
  // and the rounds before it; per judge score bucket, where review_below_score could go.
  const SPOT_CHECK = "spot check"; // the reason group of the judge's approvals held back for people
  const FIGURES = [
    ["agreement", "agreement"],
    ["kappa", "Cohen's kappa"],
    ["precision", "precision of approve"],
    ["recall", "recall of approve"],
    ["coverage", "of the judged rows covered"],
  ];

  function calibrationSection() {
    parts.calibFigures = el("div", { class: "counts", "data-testid": "calibration-figures" });
    parts.calibNotes = el("ul", { class: "hint notes", "data-testid": "calibration-notes" });
    parts.calibBuckets = el("tbody", { "data-testid": "calibration-buckets" });
    parts.calibRounds = el("tbody", { "data-testid": "calibration-rounds" });
    parts.calibPlot = el("img", { alt: "The judge against the reviewers per round, and per judge score bucket", class: "trend", "data-testid": "calibration-plot" });
    return section(
      "The judge against the reviewers",
      "calibration",
      el(
        "p",
        { class: "hint" },
        "Your verdicts on the samples you decide one by one (Accept: approve; Retry or Drop: not) beside the judge's; each counts for the judged rows of its kind (the judge's verdict and score) it stands for. Spot checks are rows the judge approved, held back for you to check.",
      ),
      parts.calibFigures,
      parts.calibNotes,
      el(
        "details",
        { class: "calib", open: true },
        el("summary", {}, "per judge score bucket (where review_below_score could go)"),
        el(
          "table",
          { class: "grid calib" },
          el("thead", {}, el("tr", {}, ["score from", "judged rows", "judge approval", "reviewed", "reviewers' approval", "agreement"].map((h) => el("th", {}, h)))),
          parts.calibBuckets,
        ),
      ),
      el(
        "details",
        { class: "calib" },
        el("summary", {}, "per round"),
        el(
          "table",
          { class: "grid calib" },
          el("thead", {}, el("tr", {}, ["round", "", "reviewed", "spot checks", "agreement", "kappa", "precision", "recall"].map((h) => el("th", {}, h)))),
          parts.calibRounds,
        ),
      ),
      parts.calibPlot,
    );
  }

  function pct(value) {
    return typeof value === "number" ? (value * 100).toFixed(1) + "%" : "–";
  }

  function figure(key, value) {
    if (key === "kappa") return typeof value === "number" ? value.toFixed(3) : "–";
    return pct(value);
  }

  // A problem reading the calibration is said in its section: the rest of the desk works without it.
  // A run whose judge is people (human) has no section: there is no judge to check.
  async function loadCalibration() {
    if (!state.calibrated) return;
    const current = latest("calibration");
    let data;
    try {
      data = await api(gatePath("/calibration"));
    } catch (error) {
      if (!current()) return;
      clear(parts.calibNotes);
      parts.calibNotes.appendChild(el("li", { class: "error" }, "Calibration: " + (error && error.message ? error.message : String(error))));
      return;
    }
    if (!current()) return;
    const c = data.calibration;
    clear(parts.calibFigures);
    parts.calibFigures.appendChild(
      el("span", { class: "count", "data-testid": "calib-reviewed" }, el("b", {}, asText(c.reviewed)), " reviewed (" + c.spot_checks + " spot checks)" + (data.live ? ", live" : "")),
    );
    for (const [key, name] of FIGURES) {
      if (key === "coverage" && !c.weighted) continue;
      parts.calibFigures.appendChild(el("span", { class: "count", "data-testid": "calib-" + key }, el("b", {}, figure(key, c[key])), " " + name));
    }
    clear(parts.calibNotes);
    for (const note of c.notes || []) parts.calibNotes.appendChild(el("li", { "data-testid": "calibration-note" }, note));
    clear(parts.calibBuckets);
    for (const b of c.buckets || []) {
      parts.calibBuckets.appendChild(
        el(
          "tr",
          { "data-testid": "calibration-bucket", "data-bucket": b.bucket },
          el("td", {}, b.bucket),
          el("td", {}, b.rows === null || b.rows === undefined ? "–" : asText(b.rows)),
          el("td", {}, pct(b.judge_approval)),
          el("td", {}, asText(b.reviewed)),
          el("td", {}, pct(b.person_approval)),
          el("td", {}, pct(b.agreement)),
        ),
      );
    }
    clear(parts.calibRounds);
    for (const r of data.rounds) {
      parts.calibRounds.appendChild(
        el(
          "tr",
          { "data-testid": "calibration-round" },
          el("td", {}, asText(r.round)),
          el("td", {}, r.live ? "live" : "applied"),
          el("td", {}, asText(r.reviewed)),
          el("td", {}, asText(r.spot_checks)),
          el("td", {}, pct(r.agreement)),
          el("td", {}, figure("kappa", r.kappa)),
          el("td", {}, pct(r.precision)),
          el("td", {}, pct(r.recall)),
        ),
      );
    }
    parts.calibPlot.src = API + gatePath("/calibration.svg") + "?v=" + encodeURIComponent(c.decisions + "-" + c.reviewed);
  }

  // ------------------------------------------------------------------------- the shards
  // A round's shards as its lanes left them (the Airflow grid shows one box per lane, not per
  // shard): state, lane, records, claim and end times, error; filtered by state, a page at a time.
  const shards = { round: null, state: "", cursors: [null], next: null, size: 100 };
  const SHARD_STATES = [
    ["", "all states"],
    ["done", "done"],
    ["failed", "failed"],
    ["unfinished", "unfinished (running or claimed)"],
    ["unclaimed", "never claimed"],
  ];

  function shardsSection() {
    parts.shardRound = el("select", { "data-testid": "shards-round", title: "round" });
    parts.shardState = el(
      "select",
      { "data-testid": "shards-state", title: "state" },
      SHARD_STATES.map(([value, text]) => el("option", { value: value }, text)),
    );
    parts.shardPrev = el("button", { type: "button", "data-testid": "shards-prev" }, "← Previous");
    parts.shardNext = el("button", { type: "button", "data-testid": "shards-next" }, "Next →");
    parts.shardInfo = el("span", { class: "page-info", "data-testid": "shards-info" });
    parts.shardReload = el("button", { type: "button", "data-testid": "shards-reload" }, "Reload");
    parts.shardReload.addEventListener("click", () => loadShards());
    parts.shardCounts = el("div", { class: "counts", "data-testid": "shard-counts" });
    parts.shards = el("tbody", { "data-testid": "shards" });
    parts.shardRound.addEventListener("change", () => {
      shards.round = parseInt(parts.shardRound.value, 10);
      shards.cursors = [null];
      loadShards();
    });
    parts.shardState.addEventListener("change", () => {
      shards.state = parts.shardState.value;
      shards.cursors = [null];
      loadShards();
    });
    parts.shardPrev.addEventListener("click", () => {
      if (shards.cursors.length > 1) shards.cursors.pop();
      loadShards();
    });
    parts.shardNext.addEventListener("click", () => {
      if (shards.next === null) return;
      shards.cursors.push(shards.next);
      loadShards();
    });
    return section(
      "Shards",
      "shards-section",
      el("p", { class: "hint" }, "Each shard of a round run by lanes, as its lane recorded it (the Airflow grid shows one box per lane)."),
      el("div", { class: "controls" }, el("label", {}, "round ", parts.shardRound), el("label", {}, "state ", parts.shardState), parts.shardReload, parts.shardPrev, parts.shardNext, parts.shardInfo),
      parts.shardCounts,
      el(
        "table",
        { class: "grid shards" },
        el("thead", {}, el("tr", {}, ["shard", "state", "lane", "records", "claimed", "ended", "took s", "error"].map((h) => el("th", {}, h)))),
        parts.shards,
      ),
    );
  }

  function when(seconds) {
    if (typeof seconds !== "number") return "";
    return new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  const STATE_LABEL = { done: "done", failed: "failed", running: "running", claimed: "claimed", unclaimed: "never claimed" };

  // A problem reading the shards (a lane document this release cannot read, storage down) is said
  // in the section, not on the status line: the rest of the desk works without it.
  async function loadShards() {
    const current = latest("shards");
    const cursor = shards.cursors[shards.cursors.length - 1];
    let data;
    try {
      data = await api(gatePath("/shards" + params({ round: shards.round, state: shards.state, cursor: cursor, size: shards.size })));
    } catch (error) {
      if (!current()) return;
      parts.shardInfo.textContent = "Shards: " + (error && error.message ? error.message : String(error));
      parts.shardInfo.className = "page-info error";
      return;
    }
    if (!current()) return;
    parts.shardInfo.className = "page-info";
    shards.round = data.round;
    shards.next = data.cursor || null;
    clear(parts.shardRound);
    for (const r of data.rounds) parts.shardRound.appendChild(el("option", { value: String(r), selected: r === data.round }, "round " + r));
    clear(parts.shardCounts);
    clear(parts.shards);
    parts.shardPrev.disabled = shards.cursors.length <= 1;
    parts.shardNext.disabled = shards.next === null;
    const counts = Object.assign({ shards: data.total, lanes: data.lanes }, data.counts);
    for (const [key, value] of Object.entries(counts)) {
      parts.shardCounts.appendChild(el("span", { class: "count", "data-testid": "shard-count-" + key }, el("b", {}, asText(value)), " " + (key === "unclaimed" ? "never claimed" : key)));
    }
    parts.shardInfo.textContent =
      "page " + shards.cursors.length + ": " + data.shards.length + " of " + data.matching + " shards" + (data.closed ? "" : " (the round has not closed: Reload for the latest)");
    if (!data.shards.length) parts.shards.appendChild(el("tr", {}, el("td", { colspan: "8", "data-testid": "no-shards" }, "No shard in this state.")));
    for (const s of data.shards) {
      const took = typeof s.claimed_at === "number" && typeof s.ended_at === "number" ? (s.ended_at - s.claimed_at).toFixed(1) : "";
      const error = el("td", { "data-testid": "shard-error" });
      if (s.error !== null && s.error !== undefined) error.appendChild(el("span", {}, s.error));
      if (typeof (s.truncated || {}).error === "number") {
        error.appendChild(el("div", { class: "truncated" }, "truncated, " + s.truncated.error.toLocaleString("en") + " bytes"));
      }
      if (s.quarantine) error.appendChild(el("div", { class: "mono hint", "data-testid": "shard-quarantine" }, "quarantined: " + s.quarantine));
      parts.shards.appendChild(
        el(
          "tr",
          { "data-testid": "shard-row", "data-shard-id": s.shard_id, "data-state": s.state },
          el("td", { class: "mono" }, s.shard_id),
          el("td", { class: "state " + s.group, "data-testid": "shard-state" }, STATE_LABEL[s.state] || s.state),
          el("td", { "data-testid": "shard-lane" }, s.lane === null ? "" : String(s.lane)),
          el("td", { "data-testid": "shard-records" }, asText(s.records)),
          el("td", {}, when(s.claimed_at)),
          el("td", {}, when(s.ended_at)),
          el("td", {}, took),
          error,
        ),
      );
    }
  }

  function plural(n, word) {
    return n + " " + word + (n === 1 ? "" : "s");
  }

  function filterText(filter) {
    const bits = [];
    if (filter.group) bits.push("reason group “" + filter.group + "”");
    if (filter.text) bits.push("text “" + filter.text + "”");
    return bits.length ? bits.join(" and ") : "every rejected sample of the round";
  }

  function label(action) {
    return { accept: "Accept", retry: "Retry", drop: "Drop" }[action] || action;
  }

  function describeFilter() {
    return filterText({ group: state.group, text: state.text });
  }

  function armBulk(on) {
    state.bulkArmed = on;
    parts.bulkConfirm.hidden = !on;
    parts.bulkCancel.hidden = !on;
    parts.bulk.hidden = on;
    parts.bulkWhat.textContent = on ? label(parts.bulkAction.value) + " all matching " + describeFilter() + "?" : "";
  }

  function setFilter(group, text) {
    state.group = group;
    state.text = text;
    state.cursors = [null];
    if (state.group || state.text) state.mode = "browse";
    parts.filterLine.textContent = "Filter: " + describeFilter();
    armBulk(false);
    renderGroups();
    loadSamples().catch(fail);
  }

  async function loadSummary() {
    const data = await api(gatePath("/summary"));
    state.groups = data.groups;
    clear(parts.counts);
    const counts = Object.assign({ "rejected rows": data.total }, data.counts || {});
    for (const [key, value] of Object.entries(counts)) {
      parts.counts.appendChild(el("span", { class: "count", "data-testid": "count" }, el("b", {}, asText(value)), " " + key));
    }
    parts.filterLine.textContent = "Filter: " + describeFilter();
    renderGroups();
  }

  function renderGroups() {
    clear(parts.groups);
    const all = el("button", { type: "button", class: state.group ? "group" : "group active", "data-testid": "group-all" }, "all reasons");
    all.addEventListener("click", () => setFilter("", state.text));
    parts.groups.appendChild(all);
    const groups = state.groups || [];
    // the spot checks (approved rows held back for people) first: the judge's approvals to check
    const ordered = groups.filter((g) => g.group === SPOT_CHECK).concat(groups.filter((g) => g.group !== SPOT_CHECK));
    for (const { group, count } of ordered) {
      if (group === "(other)") {
        // the groups past the most common ones, folded: not one reason, so not a filter
        parts.groups.appendChild(el("span", { class: "group other", "data-testid": "group-other" }, group, el("span", { class: "n" }, " " + count)));
        continue;
      }
      const spot = group === SPOT_CHECK;
      const button = el(
        "button",
        {
          type: "button",
          class: "group" + (spot ? " spot" : "") + (group === state.group ? " active" : ""),
          "data-testid": spot ? "group-spot-check" : "group",
          "data-group": group,
          title: spot ? "rows the judge approved, held back for you to check" : null,
        },
        spot ? "spot checks (judge approved)" : group,
        el("span", { class: "n" }, " " + count),
      );
      button.addEventListener("click", () => setFilter(group, state.text));
      parts.groups.appendChild(button);
    }
  }

  // Requests can answer out of order (a filter click, then a page size; two decisions in a row): of
  // each kind, only the latest request's answer is shown, an earlier one's is stale.
  const requests = {};
  function latest(kind) {
    const n = (requests[kind] = (requests[kind] || 0) + 1);
    return () => requests[kind] === n;
  }

  async function loadSamples() {
    const current = latest("samples");
    say("Loading samples…");
    let data;
    if (state.mode === "sample" && !state.group && !state.text) {
      data = await api(gatePath("/sample" + params({ n: state.n, seed: state.seed })));
      if (!current()) return;
      state.next = null;
      parts.pageInfo.textContent = data.samples.length + " random samples (seed " + data.seed + ")";
    } else {
      state.mode = "browse";
      const cursor = state.cursors[state.cursors.length - 1];
      data = await api(gatePath("/page" + params({ cursor: cursor, size: state.size, group: state.group, text: state.text })));
      if (!current()) return;
      state.next = data.cursor || null;
      const page = state.cursors.length;
      // total: the rows the filter selects, null when unknown without reading them all (a text search)
      const of = data.total === null || data.total === undefined ? "" : " of " + data.total;
      parts.pageInfo.textContent = "page " + page + ": " + data.samples.length + " shown, " + data.scanned + " rows read" + of;
    }
    // the answer stopped at [batchinfer] review_page_bytes: fewer samples than asked (Next goes on)
    if (data.capped) parts.pageInfo.textContent += " (cut short at the desk's page size: review_page_bytes)";
    state.samples = data.samples;
    parts.prev.disabled = state.mode !== "browse" || state.cursors.length <= 1;
    parts.next.disabled = state.mode !== "browse" || state.next === null;
    renderSamples();
    say("");
  }

  function verdict(sample) {
    if (sample.spot_check) return "approved"; // the judge's: held back for a person to check
    if (sample.approved === true) return "approved";
    if (sample.approved === false) return "rejected";
    return asText(sample.approved);
  }

  // A text of a sample, as the desk sent it: cut to [batchinfer] review_field_bytes when
  // sample.truncated names its path (with the whole size in bytes); then "truncated, N bytes" and a
  // "show all" button that reads the whole value from the field endpoint (only on demand).
  function fieldText(sample, path, tag, testid) {
    const box = el(tag, { "data-testid": testid }, asText(sample[path]));
    const whole = (sample.truncated || {})[path];
    if (typeof whole !== "number") return box;
    const note = el("span", { class: "truncated", "data-testid": "truncated" }, "truncated, " + whole.toLocaleString("en") + " bytes ");
    const more = el("button", { type: "button", class: "show-all", "data-testid": "show-all" }, "show all");
    more.addEventListener("click", () => {
      more.disabled = true;
      const where = { shard: sample.shard_id, position: sample.position, path: path, round: state.round };
      api(gatePath("/field" + params(where)))
        .then((data) => {
          box.textContent = asText(data.value);
          note.textContent = "whole, " + data.bytes.toLocaleString("en") + " bytes";
          more.remove();
        })
        .catch((error) => {
          more.disabled = false;
          fail(error);
        });
    });
    return el("div", {}, box, el("div", { class: "cut" }, note, more));
  }

  function renderSamples() {
    clear(parts.samples);
    if (!state.samples.length) {
      parts.samples.appendChild(el("tr", {}, el("td", { colspan: "8", "data-testid": "no-samples" }, "No samples match.")));
    }
    for (const sample of state.samples) {
      const key = JSON.stringify(sample.id);
      // a cut id names no row: such a sample is decided by a filter, not selected
      const cutId = typeof (sample.truncated || {}).id === "number";
      const box = el("input", {
        type: "checkbox",
        "data-testid": "select-sample",
        "aria-label": "select " + asText(sample.id),
        disabled: cutId,
        title: cutId ? "its id is too long to select: decide it with a filter" : null,
      });
      box.checked = state.selected.has(key);
      box.addEventListener("change", () => {
        if (box.checked) state.selected.set(key, sample.id);
        else state.selected.delete(key);
        renderSelection();
      });
      const index = state.samples.indexOf(sample);
      const row = el(
          "tr",
          { "data-testid": "sample-row", "data-sample-id": asText(sample.id), tabindex: "0", class: decidedHere.has(key) ? "decided" : null },
          el("td", {}, box),
          el("td", { class: "mono" }, fieldText(sample, "id", "span", "sample-id")),
          el(
            "td",
            { "data-testid": "sample-verdict" },
            verdict(sample),
            sample.spot_check ? [" ", spotBadge("spot-check-badge")] : null,
            juryMarker(sample) ? [" ", juryMarker(sample)] : null,
          ),
          el("td", {}, fieldText(sample, "reason", "span", "sample-reason")),
          el("td", { "data-testid": "sample-score" }, asText(sample.score)),
          el("td", { "data-testid": "sample-attempts" }, asText(sample.attempts)),
          el("td", {}, fieldText(sample, "prompt", "pre", "sample-prompt")),
          el("td", {}, fieldText(sample, "output", "pre", "sample-output")),
      );
      row.addEventListener("click", (event) => {
        if (event.target.closest("input, button, a, select, textarea, label")) return;
        const picked = window.getSelection ? String(window.getSelection()) : "";
        if (picked) return; // selecting text to copy, not opening the sample
        openFocus(index);
      });
      row.addEventListener("keydown", (event) => {
        if (event.key !== "Enter" || event.target !== row || focusOpen()) return;
        event.preventDefault();
        openFocus(index);
      });
      parts.samples.appendChild(row);
    }
    parts.selectAll.checked = state.samples.length > 0 && state.samples.every((s) => state.selected.has(JSON.stringify(s.id)));
    renderSelection();
  }

  function renderSelection() {
    parts.selection.textContent = state.selected.size + " selected";
  }

  async function decide(action, bulk) {
    const body = { action: action, note: parts.note.value.trim(), round: state.round };
    if (bulk) {
      body.filter = { group: state.group || null, text: state.text || null };
    } else {
      if (!state.selected.size) {
        say("Select samples first (the checkboxes), or apply to all matching the filter.", "error");
        return;
      }
      body.ids = Array.from(state.selected.values());
    }
    say("Recording…");
    const result = await api(gatePath("/decisions"), { method: "POST", body: body });
    if (!bulk) state.selected.clear();
    parts.note.value = "";
    armBulk(false);
    renderSamples();
    await loadDecisions();
    loadCalibration().catch(fail);
    const what = bulk ? "all matching " + describeFilter() : plural((body.ids || []).length, "sample");
    say("Recorded: " + label(action) + " " + what + ". " + plural(result.decisions, "decision") + " so far.", "ok");
  }

  async function loadDecisions() {
    const current = latest("decisions");
    const data = await api(gatePath("/decisions"));
    if (!current()) return;
    clear(parts.decisions);
    for (const d of data.decisions) {
      let what;
      if (d.ids && d.ids.length) {
        what = plural(d.ids.length, "sample") + ": " + d.ids.slice(0, 5).map(asText).join(", ") + (d.ids.length > 5 ? ", …" : "");
      }
      else if (d.filter) what = "all matching " + filterText(d.filter);
      else what = "";
      parts.decisions.appendChild(
        el(
          "tr",
          { "data-testid": "decision-row" },
          el("td", {}, asText(d.at)),
          el("td", {}, asText(d.by)),
          el("td", {}, label(d.action)),
          el("td", {}, what),
          el("td", {}, asText(d.note)),
        ),
      );
    }
    clear(parts.tally);
    parts.tally.appendChild(el("b", {}, "Tally: "));
    const tally = data.tally;
    if (tally && typeof tally === "object" && !Array.isArray(tally)) {
      const entries = Object.entries(tally);
      if (!entries.length) parts.tally.appendChild(document.createTextNode("no decisions yet"));
      for (const [key, value] of entries) {
        const name = key === "approve" ? "approved as judged (undecided spot checks)" : key;
        parts.tally.appendChild(el("span", { class: "count", "data-testid": "tally-" + key }, el("b", {}, asText(value)), " " + name));
      }
    } else {
      parts.tally.appendChild(document.createTextNode(asText(tally)));
    }
  }

  // ---------------------------------------------------------------------- the focus view
  // One sample at a time, over the samples the list shows (its page, or its random draw): its
  // prompt (a chat prompt per role), output, verdict, reason and score, id and shard, and its
  // attempts in the earlier rounds beside it. Keys (never while typing in a field): a accept, r
  // retry, d drop, j / → next, k / ← previous, n the note, ? the keys, Esc back to the list.
  // Decisions go through the list's API (POST decisions, ids: [this sample's id], the note).
  const decidedHere = new Map(); // JSON of the id -> the action recorded from this page
  const attemptsCache = new Map(); // JSON of the id -> the attempts answer
  const focus = { index: -1, node: null, help: null, note: null, body: null, busy: false };
  const KEYS = [
    ["a", "accept this sample"],
    ["r", "retry it (the next round)"],
    ["d", "drop it (out of the run)"],
    ["j or →", "next sample"],
    ["k or ←", "previous sample"],
    ["n", "write a note (saved with the next decision)"],
    ["?", "show or hide these keys"],
    ["Esc", "leave the note field; close these keys; back to the list"],
  ];
  const ROLES = ["system", "developer", "user", "assistant", "tool"];
  const LONG_LINES = 14;
  const LONG_CHARS = 1500;

  function typing(target) {
    if (!target || !target.closest) return false;
    return Boolean(target.closest("input, textarea, select, [contenteditable=''], [contenteditable='true']"));
  }

  // A chat prompt as browse.py renders it: "[role]\ncontent" blocks, blank-line separated.
  function chatParts(text) {
    const head = new RegExp("^\\[(" + ROLES.join("|") + ")\\]\\n");
    if (typeof text !== "string" || !head.test(text)) return null;
    const split = new RegExp("\\n\\n(?=\\[(?:" + ROLES.join("|") + ")\\]\\n)");
    return text.split(split).map((block) => {
      const m = block.match(head);
      return m ? { role: m[1], content: block.slice(m[0].length) } : { role: "", content: block };
    });
  }

  // Text laid out for reading: JSON pretty-printed; ``` fences as monospace blocks; the rest
  // wrapped. Only text nodes (el), whatever the text holds.
  function layout(text) {
    const box = el("div", { class: "text" });
    const trimmed = text.trim();
    if ((trimmed.startsWith("{") && trimmed.endsWith("}")) || (trimmed.startsWith("[") && trimmed.endsWith("]"))) {
      try {
        box.appendChild(el("pre", { class: "json", "data-testid": "json" }, JSON.stringify(JSON.parse(trimmed), null, 2)));
        return box;
      } catch (e) {
        // not JSON: as text
      }
    }
    const fence = /^```([^\n`]*)\n([\s\S]*?)^```[ \t]*$/gm;
    let last = 0;
    let m;
    while ((m = fence.exec(text)) !== null) {
      if (m.index > last) box.appendChild(el("div", { class: "prose" }, text.slice(last, m.index)));
      box.appendChild(el("pre", { class: "code", "data-testid": "code", "data-lang": m[1].trim() || null }, m[2].replace(/\n$/, "")));
      last = fence.lastIndex;
    }
    if (last < text.length) box.appendChild(el("div", { class: "prose" }, text.slice(last)));
    return box;
  }

  // A long block folded to a few lines, with show more / show less.
  function collapsible(content, text) {
    const wrap = el("div", { class: "fold" }, content);
    const lines = text.split("\n").length;
    if (lines <= LONG_LINES && text.length <= LONG_CHARS) return wrap;
    wrap.classList.add("folded");
    const toggle = el("button", { type: "button", class: "more", "data-testid": "toggle-more", "aria-expanded": "false" }, "show more");
    toggle.addEventListener("click", () => {
      const folded = wrap.classList.toggle("folded");
      toggle.textContent = folded ? "show more" : "show less";
      toggle.setAttribute("aria-expanded", folded ? "false" : "true");
    });
    return el("div", {}, wrap, toggle);
  }

  // A text of a sample by its path: a field, or a jury member's reason (members.<i>.reason).
  function pick(sample, path) {
    const member = /^members\.(\d+)\.reason$/.exec(path);
    return member ? ((sample.members || [])[Number(member[1])] || {}).reason : sample[path];
  }

  // One text of a sample for the focus view: laid out, folded when long; a cut one says so and
  // "show all" reads it whole (the field endpoint), laid out again.
  function readable(sample, path, testid, round) {
    const holder = el("div", { "data-testid": testid });
    const value = pick(sample, path);
    function fill(text) {
      clear(holder);
      if (path === "prompt" && chatParts(text)) {
        for (const part of chatParts(text)) {
          holder.appendChild(
            el("div", { class: "message role-" + (part.role || "none"), "data-testid": "message", "data-role": part.role }, el("div", { class: "role" }, part.role || "text"), collapsible(layout(part.content), part.content)),
          );
        }
        return;
      }
      holder.appendChild(collapsible(layout(text), text));
    }
    if (value === null || value === undefined) {
      holder.appendChild(el("p", { class: "hint" }, path === "prompt" ? "(the prompt could not be rendered: see the record)" : "(none)"));
      return holder;
    }
    fill(asText(value));
    const whole = (sample.truncated || {})[path];
    if (typeof whole !== "number") return holder;
    const note = el("span", { class: "truncated", "data-testid": "truncated" }, "truncated, " + whole.toLocaleString("en") + " bytes ");
    const more = el("button", { type: "button", class: "show-all", "data-testid": "show-all" }, "show all");
    more.addEventListener("click", () => {
      more.disabled = true;
      api(gatePath("/field" + params({ shard: sample.shard_id, position: sample.position, path: path, round: round })))
        .then((data) => {
          fill(asText(data.value));
          note.textContent = "whole, " + data.bytes.toLocaleString("en") + " bytes";
          more.remove();
        })
        .catch((error) => {
          more.disabled = false;
          fail(error);
        });
    });
    return el("div", {}, holder, el("div", { class: "cut" }, note, more));
  }

  // Thumbnails of a sample's images: each "[image N: data:image/...]" line of its prompt (how
  // prompt_text.py shows an image part) as an <img> of the image endpoint, loaded lazily and scaled
  // down by the CSS; the desk serves only images inside the record (data: URLs), none by a path.
  const IMAGE_LINE = /^\[image (\d+): data:image\/(?:png|jpeg|webp), /gm;
  const MAX_THUMBS = 16;
  function thumbnails(sample, round) {
    const strip = el("div", { class: "thumbs", "data-testid": "thumbs" });
    const text = typeof sample.prompt === "string" ? sample.prompt : "";
    for (const m of text.matchAll(IMAGE_LINE)) {
      if (strip.childNodes.length >= MAX_THUMBS) break;
      const where = { shard: sample.shard_id, position: sample.position, index: m[1], round: round };
      strip.appendChild(
        el("img", { class: "thumb", loading: "lazy", decoding: "async", alt: "image " + m[1], title: "image " + m[1], "data-testid": "thumb", src: API + gatePath("/image" + params(where)) }),
      );
    }
    return strip;
  }

  function verdictBadge(sample, testid) {
    const v = verdict(sample);
    return el("span", { class: "badge " + (v === "approved" ? "ok" : "bad"), "data-testid": testid }, v);
  }

  function spotBadge(testid) {
    return el("span", { class: "badge spot", "data-testid": testid, title: "the judge approved it; held back for a person to check" }, "spot check");
  }

  function keysHelp() {
    const rows = KEYS.map(([key, what]) => el("tr", {}, el("td", {}, el("kbd", {}, key)), el("td", {}, what)));
    const close = el("button", { type: "button", "data-testid": "shortcuts-close" }, "Close");
    close.addEventListener("click", () => showHelp(false));
    return el(
      "div",
      { class: "shortcuts", role: "dialog", "aria-label": "Keyboard shortcuts", "data-testid": "shortcuts", hidden: true },
      el("h3", {}, "Keyboard shortcuts"),
      el("table", { class: "grid" }, el("tbody", {}, rows)),
      el("p", { class: "hint" }, "Keys do nothing while you type in a field (the note, the search). Decisions are recorded for this sample alone, through the same API as the list's."),
      close,
    );
  }

  function showHelp(on) {
    if (!focus.help) return;
    focus.help.hidden = !on;
  }

  function openFocus(index) {
    if (index < 0 || index >= state.samples.length) return;
    if (!focus.node) {
      focus.note = el("textarea", { rows: "2", maxlength: "2000", placeholder: "note (n), saved with the next decision", "data-testid": "focus-note", "aria-label": "note" });
      focus.note.addEventListener("keydown", (event) => {
        if (event.key === "Escape") {
          event.preventDefault();
          event.stopPropagation();
          focus.note.blur();
        }
      });
      focus.body = el("div", { class: "focus-body", "data-testid": "focus-body" });
      focus.help = keysHelp();
      focus.node = el("div", { class: "focus", role: "dialog", "aria-modal": "true", "aria-label": "One sample", tabindex: "-1", "data-testid": "focus" }, focus.body, focus.help);
      document.body.appendChild(focus.node);
    }
    focus.index = index;
    focus.node.hidden = false;
    document.body.classList.add("focusing");
    renderFocus();
    focus.node.focus();
  }

  function closeFocus() {
    if (!focus.node || focus.node.hidden) return;
    const index = focus.index;
    focus.node.hidden = true;
    showHelp(false);
    document.body.classList.remove("focusing");
    focus.index = -1;
    renderSamples();
    const rows = parts.samples.querySelectorAll("tr[data-testid=sample-row]");
    if (rows[index]) rows[index].focus();
  }

  function focusOpen() {
    return Boolean(focus.node && !focus.node.hidden);
  }

  function focusButton(text, key, testid, onClick, extra) {
    const button = el("button", Object.assign({ type: "button", "data-testid": testid, title: "key: " + key }, extra || {}), text, " ", el("kbd", {}, key));
    button.addEventListener("click", onClick);
    return button;
  }

  function renderFocus() {
    const sample = state.samples[focus.index];
    if (!sample) return;
    const key = JSON.stringify(sample.id);
    clear(focus.body);
    const cutId = typeof (sample.truncated || {}).id === "number";
    const decided = decidedHere.get(key);
    const nav = el(
      "div",
      { class: "focus-bar" },
      focusButton("← Previous", "k", "focus-prev", () => step(-1)),
      el("span", { class: "where", "data-testid": "focus-position" }, "sample " + (focus.index + 1) + " of " + state.samples.length + (state.mode === "browse" ? " on page " + state.cursors.length : " drawn")),
      focusButton("Next →", "j", "focus-next", () => step(1)),
      el("span", { class: "spacer" }),
      focusButton("Keys", "?", "focus-keys", () => showHelp(focus.help.hidden)),
      focusButton("Back to the list", "Esc", "focus-close", closeFocus),
    );
    const actions = ["accept", "retry", "drop"].map((action) =>
      focusButton(label(action), action[0], "focus-" + action, () => focusDecide(action), { class: "decide " + action, disabled: !state.open || cutId || focus.busy }),
    );
    const noteButton = focusButton("Note", "n", "focus-note-button", () => focus.note.focus());
    focus.note.disabled = !state.open;
    focus.body.appendChild(nav);
    focus.body.appendChild(
      el(
        "header",
        { class: "focus-head" },
        el("h2", { class: "mono", "data-testid": "focus-id" }, asText(sample.id)),
        verdictBadge(sample, "focus-verdict"),
        sample.spot_check ? spotBadge("focus-spot-check") : null,
        decided ? el("span", { class: "badge decided", "data-testid": "focus-decided" }, "recorded: " + label(decided)) : null,
        el(
          "dl",
          { class: "facts" },
          el("dt", {}, "shard"),
          el("dd", { class: "mono", "data-testid": "focus-shard" }, asText(sample.shard_id) + " #" + asText(sample.position)),
          el("dt", {}, "round"),
          el("dd", {}, asText(sample.round)),
          el("dt", {}, "attempts"),
          el("dd", { "data-testid": "focus-attempts-count" }, asText(sample.attempts)),
          el("dt", {}, "score"),
          el("dd", { "data-testid": "focus-score" }, sample.score === null || sample.score === undefined ? "none" : asText(sample.score)),
          el("dt", {}, "status"),
          el("dd", {}, asText(sample.status) + (sample.error ? ": " + asText(sample.error) : "")),
        ),
      ),
    );
    focus.body.appendChild(
      el(
        "div",
        { class: "decide-bar" },
        actions,
        noteButton,
        focus.note,
        !state.open ? el("span", { class: "hint" }, "The gate is not waiting: decisions are closed.") : null,
        cutId ? el("span", { class: "hint" }, "Its id is too long to name: decide it with a filter on the list.") : null,
      ),
    );
    if (sample.spot_check) {
      focus.body.appendChild(
        el("p", { class: "hint spot-hint", "data-testid": "focus-spot-hint" }, "A spot check: the judge approved this sample. Accept it if you agree; Retry or Drop it if not. Undecided, it goes to the results as the judge said."),
      );
    }
    focus.body.appendChild(
      el(
        "div",
        { class: "focus-grid" },
        el("section", { class: "pane" }, el("h3", {}, "Prompt"), readable(sample, "prompt", "focus-prompt", state.round), thumbnails(sample, state.round)),
        el(
          "section",
          { class: "pane" },
          sample.reasoning === null || sample.reasoning === undefined ? null : el("h3", {}, "Reasoning (before the answer)"),
          sample.reasoning === null || sample.reasoning === undefined ? null : readable(sample, "reasoning", "focus-reasoning", state.round),
          el("h3", {}, "Output"),
          readable(sample, "output", "focus-output", state.round),
          sample.tool_calls === null || sample.tool_calls === undefined ? null : el("h3", {}, "Tool calls"),
          sample.tool_calls === null || sample.tool_calls === undefined ? null : readable(sample, "tool_calls", "focus-tool-calls", state.round),
          el("h3", {}, "Judge's reason"),
          readable(sample, "reason", "focus-reason", state.round),
          (sample.members || []).length ? el("h3", {}, "The jury's members") : null,
          membersList(sample, "focus-members", state.round),
        ),
      ),
    );
    const record = el("details", { class: "record" }, el("summary", {}, "record fields"), el("pre", { "data-testid": "focus-record" }, JSON.stringify(sample.record || {}, null, 2)));
    focus.body.appendChild(record);
    const attempts = el("section", { class: "attempts", "data-testid": "focus-attempts" }, el("h3", {}, "Attempts, newest first"), el("p", { class: "hint" }, "Looking in the earlier rounds…"));
    focus.body.appendChild(attempts);
    loadAttempts(sample, attempts).catch((error) => {
      clear(attempts);
      attempts.appendChild(el("h3", {}, "Attempts, newest first"));
      attempts.appendChild(el("p", { class: "error" }, "Attempts: " + (error && error.message ? error.message : String(error))));
    });
  }

  // One attempt: what it was sent (the prompt as rendered for it: a retry's template, told the
  // attempt before), what it answered, what the judge (or each jury member) said, and the reviewer's
  // retry decision that sent it on, when one did.
  function attemptColumn(sample, title, testid) {
    return el(
      "div",
      { class: "attempt", "data-testid": testid, "data-round": asText(sample.round) },
      el("h4", {}, title),
      el("div", { class: "attempt-facts" }, verdictBadge(sample, "attempt-verdict"), " ", el("span", { class: "hint" }, "attempt " + asText(sample.attempts) + " · " + asText(sample.status) + (sample.score === null || sample.score === undefined ? "" : " · score " + asText(sample.score)))),
      el("div", { class: "label" }, "prompt as sent"),
      readable(sample, "prompt", "attempt-prompt", sample.round),
      el("div", { class: "label" }, "output"),
      readable(sample, "output", "attempt-output", sample.round),
      el("div", { class: "label" }, "reason"),
      readable(sample, "reason", "attempt-reason", sample.round),
      membersList(sample, "attempt-members", sample.round),
      sentBack(sample),
    );
  }

  // A jury's verdict: each member's name, type, verdict, score and reason (folded when long), in
  // the jury's order; null for a verdict without members.
  function membersList(sample, testid, round) {
    const members = sample.members || [];
    if (!members.length) return null;
    return el(
      "ul",
      { class: "members", "data-testid": testid },
      members.map((m, i) =>
        el(
          "li",
          { class: "member " + memberVerdict(m), "data-testid": "member", "data-member": m.name },
          el(
            "div",
            { class: "member-head" },
            el("b", { "data-testid": "member-name" }, m.name),
            el("span", { class: "hint" }, m.type),
            el("span", { class: "badge " + (m.approved === true ? "ok" : "bad"), "data-testid": "member-verdict" }, memberVerdict(m)),
            m.score === null || m.score === undefined ? null : el("span", { class: "hint", "data-testid": "member-score" }, "score " + asText(m.score)),
          ),
          readable(sample, "members." + i + ".reason", "member-reason", round),
        ),
      ),
    );
  }

  function memberVerdict(member) {
    if (member.approved === true) return "approved";
    return member.approved === false ? "rejected" : "no verdict";
  }

  // The list's mark of a jury whose members did not all agree: how many approved, each one's verdict
  // in its title.
  function juryMarker(sample) {
    const members = sample.members || [];
    const yes = members.filter((m) => m.approved === true).length;
    if (members.length < 2 || yes === 0 || yes === members.length) return null;
    const title = "the jury split: " + members.map((m) => m.name + " " + memberVerdict(m)).join(", ");
    return el("span", { class: "badge split", "data-testid": "jury-split", title: title }, "jury " + yes + " of " + members.length);
  }

  // The reviewer's retry decision that sent an attempt back to the next round, with its note.
  function sentBack(sample) {
    const s = sample.sent_back;
    if (!s) return null;
    const at = typeof s.at === "string" ? " at " + s.at.replace("T", " ").slice(0, 16) + " UTC" : "";
    return el(
      "div",
      { class: "sent-back", "data-testid": "attempt-sent-back" },
      el("div", { class: "label" }, "sent back by " + asText(s.by) + at),
      s.note ? el("div", { class: "prose", "data-testid": "sent-back-note" }, asText(s.note)) : el("div", { class: "hint" }, "(no note)"),
    );
  }

  async function loadAttempts(sample, box) {
    const key = JSON.stringify(sample.id);
    const current = latest("attempts");
    let data = attemptsCache.get(key);
    if (!data) {
      data = await api(gatePath("/attempts/" + encodeURIComponent(asText(sample.id)) + params({ round: state.round })));
      attemptsCache.set(key, data);
    }
    if (!current() || state.samples[focus.index] !== sample) return;
    clear(box);
    box.appendChild(el("h3", {}, "Attempts, newest first"));
    const columns = el("div", { class: "attempt-grid", "data-testid": "attempt-columns" }, attemptColumn(sample, "round " + asText(sample.round) + " (under review)", "attempt"));
    for (const earlier of data.attempts) columns.appendChild(attemptColumn(earlier, "round " + asText(earlier.round), "attempt"));
    box.appendChild(columns);
    let said = data.attempts.length ? "" : "No earlier attempt in the rounds before this one.";
    if (!data.complete) {
      said += " Stopped after reading " + data.rows_read.toLocaleString("en") + " rows (the desk's bound per lookup): rounds before " + (data.searched.length ? Math.min(...data.searched) : data.round) + " were not searched.";
    }
    if (said) box.appendChild(el("p", { class: "hint", "data-testid": "attempts-note" }, said.trim()));
  }

  async function step(delta) {
    if (focus.busy) return;
    const next = focus.index + delta;
    if (next >= 0 && next < state.samples.length) {
      focus.index = next;
      renderFocus();
      return;
    }
    if (state.mode !== "browse") {
      say(delta > 0 ? "The last sample drawn: draw again, or browse." : "The first sample drawn.");
      return;
    }
    if (delta > 0 && state.next !== null) {
      state.cursors.push(state.next);
    } else if (delta < 0 && state.cursors.length > 1) {
      state.cursors.pop();
    } else {
      say(delta > 0 ? "The last sample of the round (with this filter)." : "The first sample.");
      return;
    }
    focus.busy = true;
    try {
      await loadSamples();
    } finally {
      focus.busy = false;
    }
    if (!state.samples.length) return closeFocus();
    focus.index = delta > 0 ? 0 : state.samples.length - 1;
    renderFocus();
  }

  async function focusDecide(action) {
    const sample = state.samples[focus.index];
    if (!sample || focus.busy || !state.open) return;
    if (typeof (sample.truncated || {}).id === "number") return;
    const body = { action: action, ids: [sample.id], note: focus.note.value.trim(), round: state.round };
    focus.busy = true;
    say("Recording…");
    try {
      const result = await api(gatePath("/decisions"), { method: "POST", body: body });
      decidedHere.set(JSON.stringify(sample.id), action);
      focus.note.value = "";
      say("Recorded: " + label(action) + " " + asText(sample.id) + ". " + plural(result.decisions, "decision") + " so far.", "ok");
      loadDecisions().catch(fail);
      loadCalibration().catch(fail);
    } finally {
      focus.busy = false;
    }
    if (focus.index < state.samples.length - 1) focus.index += 1; // on to the next sample
    renderFocus();
  }

  document.addEventListener("keydown", (event) => {
    if (!focusOpen() || event.defaultPrevented) return;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === "Escape") {
      event.preventDefault();
      if (typing(event.target)) event.target.blur();
      else if (!focus.help.hidden) showHelp(false);
      else closeFocus();
      return;
    }
    if (typing(event.target)) return; // a key typed into the note or any field is text
    const run = {
      a: () => focusDecide("accept"),
      r: () => focusDecide("retry"),
      d: () => focusDecide("drop"),
      j: () => step(1),
      ArrowRight: () => step(1),
      k: () => step(-1),
      ArrowLeft: () => step(-1),
      n: () => focus.note.focus(),
      "?": () => showHelp(focus.help.hidden),
    }[event.key];
    if (!run) return;
    event.preventDefault();
    Promise.resolve(run()).catch(fail);
  });

  function fail(error) {
    say(error && error.message ? error.message : String(error), "error");
  }

  followTheme();
  (dagId && runId ? showGate() : showGateList()).catch(fail);
})();
