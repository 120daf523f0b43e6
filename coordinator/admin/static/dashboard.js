// The operator's dashboard: reads the admin API every few seconds and renders it (transactions,
// topics, consumer groups); Abort posts to it. Plain script, no libraries. Page parameters: ?hanging_ms= (an open transaction older than
// this is hanging; default the service's largest transaction timeout), ?refresh_s=, ?minutes=.
"use strict";

(() => {
  const STATES = ["Empty", "Ongoing", "Prepared", "CompleteCommit", "CompleteAbort", "Dead"];
  const OPEN_STATES = new Set(["Ongoing", "Prepared"]);
  const SVG = "http://www.w3.org/2000/svg";

  const params = new URLSearchParams(window.location.search);
  const number = (name, fallback) => {
    const text = params.get(name);
    const value = Number(text);
    return text !== null && text !== "" && Number.isFinite(value) && value >= 0 ? value : fallback;
  };
  const hangingMs = Math.floor(number("hanging_ms", Number(document.body.dataset.hangingMs) || 900000));
  const refreshMs = Math.max(1, number("refresh_s", 5)) * 1000;
  const minutes = Math.min(Math.max(1, Math.floor(number("minutes", 60))), 1440);

  const $ = (selector) => document.querySelector(selector);
  let timer = null;

  class ApiError extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  // The session cookie goes with every call; a change of state also sends the header that tells
  // the service the call comes from this page (a cross-site form cannot send it).
  async function api(path, options = {}) {
    const response = await fetch(path, { credentials: "same-origin", cache: "no-store", ...options });
    if (!response.ok) {
      let detail = `${response.status} ${response.statusText}`;
      try {
        const problem = await response.json();
        detail = problem.detail || detail;
      } catch (_) {
        // not a problem document; keep the status line
      }
      throw new ApiError(response.status, detail);
    }
    return response.json();
  }

  function element(tag, attributes = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes)) {
      if (name === "class") node.className = value;
      else if (name.startsWith("data-")) node.setAttribute(name, value);
      else node[name] = value;
    }
    node.append(...children.filter((child) => child !== null && child !== undefined));
    return node;
  }

  function svg(tag, attributes = {}, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
    node.append(...children);
    return node;
  }

  function duration(ms) {
    const seconds = Math.max(0, Math.floor(ms / 1000));
    const d = Math.floor(seconds / 86400);
    const h = Math.floor((seconds % 86400) / 3600);
    const m = Math.floor((seconds % 3600) / 60);
    const s = seconds % 60;
    const two = (n) => String(n).padStart(2, "0");
    if (d > 0) return `${d}d ${two(h)}h`;
    if (h > 0) return `${h}h ${two(m)}m`;
    if (m > 0) return `${m}m ${two(s)}s`;
    return `${s}s`;
  }

  const clock = (iso) => iso.slice(11, 19);

  function setStatus(text, error) {
    const status = $("#status");
    status.textContent = text;
    status.classList.toggle("error", Boolean(error));
  }

  function notice(text, error) {
    const box = $("#notice");
    box.textContent = text;
    box.classList.toggle("error", Boolean(error));
    box.hidden = false;
  }

  function renderStates(states) {
    const cards = STATES.map((state) =>
      element(
        "div",
        { class: `state${OPEN_STATES.has(state) ? " open" : ""}`, id: `state-${state}`, "data-count": String(states[state] || 0) },
        element("div", { class: "label" }, state),
        element("div", { class: "count" }, String(states[state] || 0)),
      ),
    );
    $("#states").replaceChildren(...cards);
  }

  function partitionsText(partitions) {
    const names = partitions.map((p) => `${p.topic}-${p.partition}`);
    return names.length > 6 ? `${names.slice(0, 6).join(", ")} +${names.length - 6} more` : names.join(", ");
  }

  function renderOpen(open, hanging, now) {
    const hangingIds = new Set(hanging.transactions.map((t) => t.transactional_id));
    const started = (t) => Date.parse(t.started_at);
    const rows = open.transactions
      .filter((t) => OPEN_STATES.has(t.state))
      .sort((a, b) => hangingIds.has(b.transactional_id) - hangingIds.has(a.transactional_id) || started(a) - started(b))
      .map((t) => {
        const isHanging = hangingIds.has(t.transactional_id);
        const partitions = partitionsText(t.partitions);
        const button = isHanging
          ? element("button", { class: "abort", type: "button", title: `Abort ${t.transactional_id}` }, "Abort")
          : null;
        if (button) button.addEventListener("click", () => abort(t.transactional_id, button));
        return element(
          "tr",
          { class: isHanging ? "hanging" : "", "data-tid": t.transactional_id },
          element("td", { class: "tid" }, t.transactional_id, isHanging ? element("span", { class: "badge" }, "hanging") : null),
          element("td", {}, t.state),
          element("td", { class: "num age" }, duration(now - started(t))),
          element("td", { class: "num" }, String(t.producer_id)),
          element("td", { class: "num" }, String(t.producer_epoch)),
          element("td", { class: "parts", title: t.partitions.map((p) => `${p.topic}-${p.partition}`).join(", ") }, partitions || "—"),
          element("td", {}, button),
        );
      });
    $("#open tbody").replaceChildren(...rows);
    $("#open").hidden = rows.length === 0;
    $("#open-empty").hidden = rows.length > 0;
    $("#hanging-rule").textContent =
      `Hanging (highlighted, with Abort): open for longer than ${duration(hangingMs)}` +
      ` (hanging_ms=${hangingMs}). ${hangingIds.size} hanging of ${rows.length} open.`;

    const pinned = hanging.partitions.map((p) =>
      element(
        "tr",
        { class: "hanging" },
        element("td", {}, p.topic),
        element("td", { class: "num" }, String(p.partition)),
        element("td", { class: "num" }, String(p.producer_id)),
        element("td", { class: "num" }, String(p.current_txn_start_offset)),
      ),
    );
    $("#pinned tbody").replaceChildren(...pinned);
    $("#pinned").hidden = pinned.length === 0;
  }

  function renderChart(perMinute) {
    // Drawn at the container's own width, so bars and labels keep their size.
    const width = Math.max(320, Math.floor($("#chart").clientWidth));
    const height = 150;
    const left = 34;
    const bottom = 20;
    const top = 8;
    const plot = height - bottom - top;
    const slot = (width - left - 4) / Math.max(1, perMinute.length);
    const most = Math.max(1, ...perMinute.map((m) => Math.max(m.commits, m.aborts)));
    const bar = Math.max(1, slot * 0.42);
    const chart = svg("svg", {
      viewBox: `0 0 ${width} ${height}`,
      role: "img",
      "aria-label": "commits and aborts per minute",
    });
    chart.append(
      svg("line", { class: "axis", x1: left, y1: top + plot, x2: width, y2: top + plot }),
      svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: top + plot }),
      svg("text", { x: left - 6, y: top + 10, "text-anchor": "end" }, String(most)),
      svg("text", { x: left - 6, y: top + plot, "text-anchor": "end" }, "0"),
    );
    const every = perMinute.length <= 120 ? 15 : perMinute.length <= 480 ? 60 : 180;
    let commits = 0;
    let aborts = 0;
    perMinute.forEach((m, i) => {
      commits += m.commits;
      aborts += m.aborts;
      const x = left + 2 + i * slot;
      const hhmm = m.minute.slice(11, 16);
      // A labelled tick at round times; the right end is labelled "now".
      const minuteOfDay = Number(hhmm.slice(0, 2)) * 60 + Number(hhmm.slice(3));
      if (minuteOfDay % every === 0 && x < width - 50) {
        chart.append(
          svg("line", { class: "tick", x1: x, y1: top, x2: x, y2: top + plot }),
          svg("text", { x, y: height - 4, "text-anchor": "middle" }, hhmm),
        );
      }
      const group = svg("g", {}, svg("title", {}, `${hhmm} UTC: ${m.commits} commits, ${m.aborts} aborts`));
      // An invisible full-height target, so the tooltip shows for empty minutes too.
      group.append(svg("rect", { x, y: top, width: slot, height: plot, fill: "transparent" }));
      for (const [value, kind, offset] of [[m.commits, "commit", 0], [m.aborts, "abort", bar]]) {
        if (value === 0) continue;
        const h = Math.max(2, (value / most) * plot);
        group.append(svg("rect", { class: kind, x: x + offset, y: top + plot - h, width: bar, height: h }));
      }
      chart.append(group);
    });
    chart.append(svg("text", { x: width - 2, y: height - 4, "text-anchor": "end" }, "now"));
    $("#chart").replaceChildren(chart);
    $("#total-commits").textContent = String(commits);
    $("#total-aborts").textContent = String(aborts);
    $("#chart-window").textContent = `in the last ${perMinute.length} min, UTC (transactions with partitions)`;
  }

  function renderEffects(effects, now) {
    const cards = [["claimed", "Claimed"], ["done", "Done"], ["lapsed", "Lease ran out"]].map(([name, label]) =>
      element(
        "div",
        { class: `state${name === "lapsed" && effects[name] > 0 ? " open" : ""}`, id: `effects-${name}`, "data-count": String(effects[name]) },
        element("div", { class: "label" }, label),
        element("div", { class: "count" }, String(effects[name])),
      ),
    );
    $("#effects").replaceChildren(...cards);
    const rows = effects.lapsed_claims.map((e) =>
      element(
        "tr",
        { "data-key": e.key },
        element("td", { class: "tid" }, e.key),
        element("td", {}, e.owner || "—"),
        element("td", { class: "num" }, String(e.fencing_token)),
        element("td", { class: "num age" }, duration(now - Date.parse(e.lease_expires_at))),
      ),
    );
    $("#lapsed tbody").replaceChildren(...rows);
    $("#lapsed").hidden = rows.length === 0;
  }

  function bytes(n) {
    if (n < 1024) return `${n} B`;
    const units = ["KiB", "MiB", "GiB", "TiB"];
    let value = n;
    let unit = -1;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return `${value.toFixed(1)} ${units[unit]}`;
  }

  // A topic's cleanup policy with what limits it: "delete, retention 7d, no size limit".
  function cleanupText(topic) {
    const parts = [topic.cleanup_policy];
    if (topic.cleanup_policy.includes("delete")) {
      parts.push(topic.retention_ms < 0 ? "kept forever" : `retention ${duration(topic.retention_ms)}`);
      parts.push(topic.retention_bytes < 0 ? "no size limit" : `at most ${bytes(topic.retention_bytes)} per partition`);
    }
    return parts.join(", ");
  }

  function renderTopics(topics) {
    const blocks = topics.map((topic) => {
      const rows = topic.partitions.map((p) =>
        element(
          "tr",
          { "data-topic": topic.name, "data-partition": String(p.partition) },
          element("td", { class: "num" }, String(p.partition)),
          element("td", { class: "num log-start" }, String(p.log_start_offset)),
          element("td", { class: "num hw" }, String(p.high_watermark)),
          element("td", { class: "num lso" }, String(p.last_stable_offset)),
          element("td", { class: `num lag${p.lso_lag > 0 ? " lagging" : ""}` }, String(p.lso_lag)),
          element("td", { class: "num bytes" }, bytes(p.bytes)),
        ),
      );
      const head = element(
        "tr",
        {},
        element("th", { class: "num" }, "Partition"),
        element("th", { class: "num" }, "Log start"),
        element("th", { class: "num" }, "High watermark"),
        element("th", { class: "num" }, "LSO"),
        element("th", { class: "num" }, "LSO lag"),
        element("th", { class: "num" }, "Bytes kept"),
      );
      return element(
        "div",
        { class: "topic", "data-topic": topic.name },
        element("h3", {}, topic.name),
        element("p", { class: "cleanup" }, cleanupText(topic)),
        element("table", { class: "grid" }, element("thead", {}, head), element("tbody", {}, ...rows)),
      );
    });
    $("#topics").replaceChildren(...blocks);
    $("#topics-empty").hidden = blocks.length > 0;
  }

  const partitionName = (p) => `${p.topic}-${p.partition}`;

  // Each group: its state and epoch, its members with their assignments, and every partition it
  // owns or committed with the owner, committed offset, high watermark and lag.
  function renderGroups(groups, now) {
    const blocks = groups.map((group) => {
      const members = group.members.map((m) =>
        element(
          "tr",
          { "data-member": m.member_id },
          element("td", { class: "tid" }, m.member_id),
          element("td", {}, m.client_id || "—"),
          element("td", { class: "num epoch" }, String(m.member_epoch)),
          element("td", { class: "parts assignment" }, m.assignment.map(partitionName).join(", ") || "—"),
          element("td", { class: "num" }, m.last_heartbeat_at ? `${duration(now - Date.parse(m.last_heartbeat_at))} ago` : "—"),
        ),
      );
      // Committed offsets, and the partitions members own that have none committed yet.
      const owner = new Map();
      const rows = new Map(group.offsets.map((o) => [partitionName(o), o]));
      for (const m of group.members) {
        for (const p of m.assignment) {
          owner.set(partitionName(p), m.member_id);
          if (!rows.has(partitionName(p))) rows.set(partitionName(p), { ...p, offset: null, high_watermark: null, lag: null });
        }
      }
      const partitions = [...rows.values()]
        .sort((a, b) => a.topic.localeCompare(b.topic) || a.partition - b.partition)
        .map((o) =>
          element(
            "tr",
            { "data-tp": partitionName(o) },
            element("td", {}, o.topic),
            element("td", { class: "num" }, String(o.partition)),
            element("td", { class: "tid owner" }, o.member_id || owner.get(partitionName(o)) || "—"),
            element("td", { class: "num committed" }, o.offset === null ? "—" : String(o.offset)),
            element("td", { class: "num" }, o.high_watermark === null ? "—" : String(o.high_watermark)),
            element("td", { class: `num lag${o.lag > 0 ? " lagging" : ""}` }, o.lag === null ? "—" : String(o.lag)),
          ),
        );
      // Column titles; a title ending in "#" heads a numeric column (shown without the "#").
      const head = (...names) =>
        element("thead", {}, element("tr", {}, ...names.map((n) =>
          n.endsWith("#") ? element("th", { class: "num" }, n.slice(0, -1)) : element("th", {}, n))));
      return element(
        "div",
        { class: "group", "data-group": group.group_id },
        element(
          "h3",
          {},
          group.group_id,
          element("span", { class: `meta group-state ${group.state}` }, group.state),
          element("span", { class: "meta" }, `epoch ${group.group_epoch} · ${group.members.length} member(s)`),
        ),
        members.length
          ? element("table", { class: "grid members" }, head("Member", "Client", "Epoch#", "Assignment", "Heartbeat#"), element("tbody", {}, ...members))
          : null,
        partitions.length
          ? element("table", { class: "grid partitions" }, head("Topic", "Partition#", "Owner", "Committed#", "High watermark#", "Lag#"), element("tbody", {}, ...partitions))
          : null,
      );
    });
    $("#groups").replaceChildren(...blocks);
    $("#groups-empty").hidden = blocks.length > 0;
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const [stats, open, hanging, groups] = await Promise.all([
        api(`/v1/admin/stats?minutes=${minutes}`),
        api("/v1/admin/transactions?older_than_ms=0&limit=10000"),
        api(`/v1/admin/hanging?max_transaction_timeout_ms=${hangingMs}`),
        api("/v1/admin/groups"),
      ]);
      const now = Date.parse(stats.now);
      renderStates(stats.states);
      renderOpen(open, hanging, now);
      renderChart(stats.per_minute);
      renderTopics(stats.topics);
      renderGroups(groups.groups, now);
      renderEffects(stats.effects, now);
      setStatus(`Updated ${clock(stats.now)} UTC · refreshes every ${refreshMs / 1000} s`, false);
      document.body.dataset.updated = stats.now;
    } catch (error) {
      if (error.status === 401) setStatus("Signed out: reload the page to sign in again.", true);
      else setStatus(`Refresh failed: ${error.message}`, true);
    } finally {
      timer = setTimeout(refresh, refreshMs);
    }
  }

  async function abort(transactionalId, button) {
    const question =
      `Abort transaction "${transactionalId}"?\n\n` +
      "Its records are discarded and its producer is fenced (epoch raised); the producer must " +
      "call InitPid again.";
    if (!window.confirm(question)) return;
    button.disabled = true;
    try {
      const answer = await api(`/v1/admin/transactions/${encodeURIComponent(transactionalId)}/abort`, {
        method: "POST",
        headers: { "x-coordinator-dashboard": "1" },
      });
      notice(`Aborted "${transactionalId}": ${answer.state}, producer ${answer.producer_id} now at epoch ${answer.producer_epoch}.`);
    } catch (error) {
      notice(`Abort of "${transactionalId}" failed: ${error.message}`, true);
      button.disabled = false;
    }
    await refresh();
  }

  $("#signout").hidden = document.body.dataset.auth !== "on";
  refresh();
})();
