// Keel's dashboard: a little script for what a server-rendered page cannot do alone.
// - the jobs list refreshes its table every few seconds (first page only);
// - a job's page follows the job live: each event on its stream triggers a read of the
//   job's record, and the page shows the record (state, progress, counters, runs);
// - forms with data-confirm ask first.
"use strict";

(function () {
  function refreshTable() {
    var box = document.getElementById("jobs-table");
    var toggle = document.getElementById("auto-refresh");
    if (!box) return;
    var every = parseInt(box.dataset.refreshMs, 10);
    if (!every) { if (toggle) toggle.parentElement.hidden = true; return; }
    setInterval(function () {
      if (toggle && !toggle.checked) return;
      if (document.hidden) return;
      fetch(box.dataset.refreshUrl, { credentials: "same-origin", headers: { Accept: "text/html-partial" } })
        .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
        .then(function (html) { box.innerHTML = html; box.dataset.refreshedAt = String(Date.now()); })
        .catch(function () { /* the next tick tries again */ });
    }, every);
  }

  var FINISHED = ["completed", "failed", "cancelled"];

  function percentOf(progress) {
    if (progress && typeof progress === "object" && typeof progress.percent === "number") return progress.percent;
    if (typeof progress === "number") return progress;
    return 0;
  }

  function text(el, value) { if (el) el.textContent = value == null ? "—" : String(value); }

  var MOMENT = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d/;

  function shown(value) {
    // As the server renders times: "YYYY-MM-DD HH:MM:SS" (UTC).
    return typeof value === "string" && MOMENT.test(value) ? value.slice(0, 19).replace("T", " ") : value;
  }

  function showActions(state) {
    // Only the actions the job's state allows; the section goes when none is left.
    var section = document.getElementById("actions");
    if (!section) return;
    var any = false;
    section.querySelectorAll("form[data-states]").forEach(function (form) {
      form.hidden = form.dataset.states.split(" ").indexOf(state) < 0;
      any = any || !form.hidden;
    });
    section.hidden = !any;
  }

  function renderRuns(runs) {
    var ol = document.getElementById("runs");
    var none = document.getElementById("no-runs");
    if (!ol) return;
    ol.replaceChildren();
    runs.forEach(function (run) {
      var li = document.createElement("li");
      var outcome = run.outcome || "running";
      li.className = "run run-" + outcome;
      var b = document.createElement("b");
      b.textContent = outcome === "manual-retry" ? "manual retry" : "attempt " + run.attempt;
      li.appendChild(b);
      if (outcome !== "manual-retry") {
        li.appendChild(document.createTextNode(" " + outcome + " "));
        var when = document.createElement("span");
        when.className = "muted";
        when.textContent = (shown(run.startedAt) || "") + " → " + (shown(run.finishedAt) || "");
        li.appendChild(when);
        if (run.error || run.reason) {
          var why = document.createElement("div");
          why.className = "muted";
          why.textContent = run.error || run.reason;
          li.appendChild(why);
        }
      }
      ol.appendChild(li);
    });
    ol.hidden = runs.length === 0;
    if (none) none.hidden = runs.length !== 0;
  }

  function render(article, job) {
    article.dataset.state = job.state;
    var badge = article.querySelector('[data-field="state"] .state');
    if (badge) { badge.className = "state state-" + job.state; badge.textContent = job.state; }
    var pct = percentOf(job.progress);
    var bar = document.getElementById("job-progress");
    if (bar) bar.value = pct;
    text(article.querySelector('[data-field="percent"]'), pct + "%");
    var step = job.progress && job.progress.step;
    text(article.querySelector('[data-field="step"]'), step || "");
    ["attemptsMade", "attemptsStarted", "stalledCount", "processedOn", "finishedOn", "runAt"].forEach(function (f) {
      text(article.querySelector('[data-field="' + f + '"]'), shown(job[f]));
    });
    showActions(job.state);
    var failure = document.getElementById("failure");
    if (failure) {
      failure.hidden = !job.failedReason;
      text(failure.querySelector('[data-field="failedReason"]'), job.failedReason || "");
    }
    var result = document.getElementById("result");
    if (result && job.result != null) {
      result.hidden = false;
      text(result.querySelector('[data-field="result"]'), JSON.stringify(job.result, null, 2));
    }
    renderRuns(job.runs || []);
    // What the page has shown, in order (a test reads it; a person sees the bar move).
    var seen = window.keelProgressSeen = window.keelProgressSeen || [];
    if (seen[seen.length - 1] !== pct) seen.push(pct);
  }

  function followJob() {
    var article = document.getElementById("job");
    if (!article) return;
    var inFlight = false, again = false, source = null, poller = null;
    var note = document.getElementById("live-note");

    function stop() {
      if (source) source.close();
      if (poller) clearInterval(poller);
      source = poller = null;
      if (note) note.hidden = true;
    }

    function refresh() {
      if (inFlight) { again = true; return; }
      inFlight = true;
      fetch(article.dataset.stateUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
        .then(function (job) {
          render(article, job);
          if (FINISHED.indexOf(job.state) >= 0) stop();
        })
        .catch(function () { /* the next event or poll tries again */ })
        .finally(function () { inFlight = false; if (again) { again = false; refresh(); } });
    }

    if (FINISHED.indexOf(article.dataset.state) >= 0) {
      var bar = document.getElementById("job-progress");
      window.keelProgressSeen = [bar ? Number(bar.value) : 0];
      return;
    }
    if (note) note.hidden = false;
    if (window.EventSource) {
      source = new EventSource(article.dataset.eventsUrl);
      ["waiting", "active", "progress", "completed", "failed", "retrying", "delayed", "stalled", "cancelled"]
        .forEach(function (name) { source.addEventListener(name, refresh); });
      source.addEventListener("open", refresh);
    }
    poller = setInterval(refresh, 3000); // a slow safety net: streams can be cut by proxies
    refresh();
  }

  function confirmForms() {
    document.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (event) {
        if (!window.confirm(form.dataset.confirm)) event.preventDefault();
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    refreshTable();
    followJob();
    confirmForms();
  });
})();
