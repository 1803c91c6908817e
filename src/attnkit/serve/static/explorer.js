// The attnkit explorer: one page, no build step, nothing fetched beyond this server.
// Its numbers come from /api/ (serve/explorer.py); `window.attnkit` exposes the state and the computations the
// tests read (weights, reshape).
(() => {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const key = new URLSearchParams(location.hash.slice(1)).get("key");  // the API key, when the server needs one
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  const state = { info: null, data: null, kind: 0, layer: 0, head: 0, query: null, steps: null, seed: 0,
                  rendered: 0, stepsAsked: 0, analyzeAsked: 0, inspect: null, pattern: null, inspectAsked: 0, model: null, modelAsked: 0,
                  sae: null, saeAsked: 0, saeToken: null, saeFeature: null,
                  training: { next: 0, records: [] }, pending: 0 };

  async function api(path, body) {  // state.pending: the requests not yet answered (their views still to draw)
    const options = body === undefined ? { headers } :
      { method: "POST", headers: { ...headers, "Content-Type": "application/json" }, body: JSON.stringify(body) };
    state.pending += 1;
    try {
      const response = await fetch(path, options);
      const json = await response.json();
      if (!response.ok) throw new Error(json.error ? json.error.message : response.statusText);
      return json;
    } finally {
      state.pending -= 1;
    }
  }

  // POST `body` to `path` as the request `counter` counts: its answer, or null when it failed (`fail` is told why)
  // or a later one was asked meanwhile (a later request's answer wins, whatever order the answers come in)
  async function latest(counter, path, body, fail) {
    const asked = ++state[counter];
    try {
      const answer = await api(path, body);
      return asked === state[counter] ? answer : null;
    } catch (error) {
      if (asked === state[counter]) fail(error.message);
      return null;
    }
  }

  function pageText() {  // the Text box, and a translator's Target when one is typed
    const body = { text: $("text").value };
    if (state.info.translator && $("target").value.trim()) body.target = $("target").value;
    return body;
  }

  // Tabs ------------------------------------------------------------------------------------------------------------
  document.querySelectorAll("#tabs button").forEach((button) => button.addEventListener("click", () => {
    document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("active", b === button));
    document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t.id === `tab-${button.dataset.tab}`));
    if (button.dataset.tab === "experiments") loadExperiments();
    if (button.dataset.tab === "training") drawCharts();
  }));

  // Explore: analysis ---------------------------------------------------------------------------------------------
  async function analyze() {
    $("message").textContent = "";
    const body = pageText();
    const data = await latest("analyzeAsked", "/api/analyze", body, (why) => { $("message").textContent = why; });
    if (!data) return;
    state.data = data;
    state.query = null;  // a new text is queried from its last token: under a causal mask token 0 sees only itself
    const maps = state.data.attention;
    state.kind = Math.min(state.kind, Math.max(maps.length - 1, 0));
    fillSelect($("kind"), maps.map((m, i) => [i, m.title]), state.kind);
    drawTokens();
    selectMaps();
    drawNext();
    drawClasses();
    if (state.inspect && state.inspect.text !== body.text) {
      $("inspect-status").textContent = "computed for an earlier text: press Inspect this text for this one";
    }
    state.rendered += 1;
  }

  function fillSelect(select, options, value) {
    select.innerHTML = "";
    for (const [v, label] of options) {
      const option = document.createElement("option");
      option.value = v;
      option.textContent = label;
      select.appendChild(option);
    }
    select.value = value;
  }

  function drawTokens() {
    const box = $("tokens");
    box.innerHTML = "";
    state.data.tokens.forEach((token, i) => {
      const chip = document.createElement("span");
      chip.className = "token";
      chip.innerHTML = `<span></span><small>${state.data.ids[i]}</small>`;
      chip.firstChild.textContent = token;
      box.appendChild(chip);
    });
  }

  function currentMaps() { return state.data && state.data.attention[state.kind]; }

  function selectMaps() {
    const maps = currentMaps();
    $("attention-panel").classList.toggle("hidden", !maps);
    $("steps-panel").classList.toggle("hidden", !maps);
    $("patterns-panel").classList.toggle("hidden", !maps);
    if (!maps) return;
    state.layer = Math.min(state.layer, maps.layers.length - 1);
    fillSelect($("layer"), maps.layers.map((l, i) => [i, `${l}`]), state.layer);
    const heads = $("heads");
    heads.innerHTML = "";
    for (const head of [...maps.heads.map((_, i) => i), "mean"]) {
      const button = document.createElement("button");
      button.dataset.head = head;
      button.textContent = head === "mean" ? "mean" : maps.heads[head];
      button.addEventListener("click", () => { state.head = head === "mean" ? null : head; drawAttention(); });
      heads.appendChild(button);
    }
    if (state.head !== null && state.head >= maps.heads.length) state.head = 0;
    const last = maps.query_tokens.length - 1;
    state.query = state.query === null ? last : Math.min(state.query, last);
    fillSelect($("query"), maps.query_tokens.map((t, i) => [i, `${i}: ${t}`]), state.query);
    drawAttention();
  }

  // (T, S) weights of a view's layer and head (null: the mean over the heads)
  function weights(kind, layer, head) {
    const w = state.data.attention[kind].weights[layer];
    if (head !== null) return w[head];
    return w[0].map((row, t) => row.map((_, s) => w.reduce((sum, h) => sum + h[t][s], 0) / w.length));
  }

  function drawAttention() {
    const maps = currentMaps();
    document.querySelectorAll("#heads button").forEach((b) =>
      b.classList.toggle("active", String(state.head === null ? "mean" : state.head) === b.dataset.head));
    const w = weights(state.kind, state.layer, state.head);
    drawHeatmap(w, maps);
    drawLines(w, maps, null);
    drawPatterns(w, maps);
    loadSteps();
  }

  // circuitsvis-style: every head of the layer as a thumbnail, and the text as two strips of tokens that light up by
  // the selected head's weights from (hovered query: its row) or to (hovered key: its column) the hovered token
  function drawPatterns(w, maps) {
    const grid = $("head-grid");
    grid.innerHTML = "";
    maps.heads.forEach((name, h) => {
      const thumb = document.createElement("span");
      thumb.className = "head-thumb" + (state.head === h ? " active" : "");
      thumb.dataset.head = h;
      const canvas = document.createElement("canvas");
      canvas.width = canvas.height = 72;
      const pattern = weights(state.kind, state.layer, h);
      const cell = 72 / Math.max(pattern.length, pattern[0].length);
      const context = canvas.getContext("2d");
      const max = Math.max(...pattern.flat(), 1e-9);
      pattern.forEach((row, t) => row.forEach((value, s) => {
        context.fillStyle = colour(value / max);
        context.fillRect(s * cell, t * cell, Math.ceil(cell), Math.ceil(cell));
      }));
      thumb.appendChild(canvas);
      thumb.appendChild(document.createTextNode(`head ${name}`));
      thumb.addEventListener("click", () => { state.head = h; drawAttention(); });
      grid.appendChild(thumb);
    });
    const strip = (box, tokens, side) => {
      box.innerHTML = "";
      tokens.forEach((token, i) => {
        const span = document.createElement("span");
        span.textContent = token;
        span.dataset.index = i;
        span.addEventListener("mouseenter", () => focusPattern(side, i));
        span.addEventListener("mouseleave", () => focusPattern(null, null));
        box.appendChild(span);
      });
    };
    strip($("pattern-queries"), maps.query_tokens, "query");
    strip($("pattern-keys"), maps.key_tokens, "key");
    state.pattern = { w, side: null, index: null, shades: [] };
  }

  // light the other strip by the weights from (side "query") or to (side "key") token `index`; null: clear
  function focusPattern(side, index) {
    const { w } = state.pattern;
    const queries = [...$("pattern-queries").children], keys = [...$("pattern-keys").children];
    for (const span of [...queries, ...keys]) {
      span.style.background = "";
      span.style.color = "";
      span.classList.remove("focus");
      span.removeAttribute("title");
    }
    state.pattern = { w, side, index, shades: [] };
    if (side === null) return;
    const shades = side === "query" ? w[index] : w.map((row) => row[index]);  // (S,) its row, or (T,) its column
    const lit = side === "query" ? keys : queries;
    (side === "query" ? queries : keys)[index].classList.add("focus");
    const top = Math.max(...shades, 1e-9);  // shaded against the largest, so a spread-out head still shows its shape
    shades.forEach((value, j) => {
      const v = Math.max(0, Math.min(1, value / top));
      lit[j].style.background = side === "query" ? colour(v) :
        `rgb(255,${Math.round(255 - 140 * v)},${Math.round(255 - 235 * v)})`;  // white -> orange
      if (v > 0.6) lit[j].style.color = "#fff";
      lit[j].title = `${side === "query" ? "attends to it" : "attends to the key"} with weight ${value.toFixed(4)}`;
    });
    state.pattern.shades = shades;
  }

  function colour(value) {  // white -> deep blue
    const v = Math.max(0, Math.min(1, value));
    return `rgb(${Math.round(255 - 226 * v)},${Math.round(255 - 177 * v)},${Math.round(255 - 39 * v)})`;
  }

  // The heatmap: rows the queries, columns the keys, each cell at least HEATMAP_MIN_CELL px with labels as large, so
  // a long text's canvas grows (its figure scrolls) rather than losing its last rows; a colour bar beside it states
  // the scale, white 0 to dark blue the map's largest weight.
  const HEATMAP_SPACE = 350, HEATMAP_MIN_CELL = 10, KEY_ANGLE = Math.PI / 3;
  const BAR = { gap: 16, width: 14, height: 120, labels: 56 };
  function drawHeatmap(w, maps) {
    const canvas = $("heatmap");
    const context = canvas.getContext("2d");
    const rows = w.length, columns = w[0].length;
    const cell = Math.max(HEATMAP_MIN_CELL, Math.min(40, Math.floor(HEATMAP_SPACE / Math.max(rows, columns))));
    const font = `${Math.min(12, cell)}px monospace`;
    context.font = font;
    const widest = (tokens) => Math.max(...tokens.map((t) => context.measureText(t).width));
    const left = Math.ceil(widest(maps.query_tokens)) + 8;
    const keyWidth = widest(maps.key_tokens), top = Math.ceil(keyWidth * Math.sin(KEY_ANGLE)) + 8;
    const barLeft = left + columns * cell + BAR.gap, barHeight = Math.max(rows * cell, BAR.height);
    canvas.width = Math.max(barLeft + BAR.width + BAR.labels, left + columns * cell + keyWidth * Math.cos(KEY_ANGLE));
    canvas.height = top + barHeight + 8;  // a new size clears the canvas and its settings
    context.fillStyle = "#fff";
    context.fillRect(0, 0, canvas.width, canvas.height);
    const max = Math.max(...w.flat());
    for (let t = 0; t < rows; t++) {
      for (let s = 0; s < columns; s++) {
        context.fillStyle = colour(max > 0 ? w[t][s] / max : 0);
        context.fillRect(left + s * cell, top + t * cell, cell - 1, cell - 1);
      }
    }
    context.fillStyle = "#1d2330";
    context.font = font;
    context.textAlign = "right";
    context.textBaseline = "middle";
    maps.query_tokens.forEach((token, t) => context.fillText(token, left - 4, top + t * cell + cell / 2));
    context.save();
    maps.key_tokens.forEach((token, s) => {
      context.setTransform(1, 0, 0, 1, left + s * cell + cell / 2, top - 4);
      context.rotate(-KEY_ANGLE);
      context.textAlign = "left";
      context.fillText(token, 0, 0);
    });
    context.restore();
    const bar = drawColourBar(context, { x: barLeft, top, width: BAR.width, height: barHeight, max, colour,
                                         font: "11px monospace" });  // colour_bar.js
    // where the cells and the scale were drawn, each tick at its y (read by tests)
    state.heatmap = { left, top, cell, max, barTop: bar.top, barHeight: bar.height, ticks: bar.ticks };
  }

  // bertviz-style: queries on the left, keys on the right, a line per pair as opaque as its weight
  const LINE_ROW = 14, LINE_SPAN = 180;  // px: the least row height (12 px labels), the lines' width
  function drawLines(w, maps, focus) {
    const svg = $("lines");
    const n = Math.max(w.length, w[0].length);
    const step = Math.max(LINE_ROW, Math.min(24, 400 / n));  // a long text's view grows, each label on its own row
    const ruler = document.createElement("canvas").getContext("2d");
    ruler.font = "12px ui-monospace, monospace";  // as `svg text` is drawn (explorer.css)
    const widest = (tokens) => Math.max(90, Math.ceil(Math.max(...tokens.map((t) => ruler.measureText(t).width))) + 8);
    const left = widest(maps.query_tokens), right = left + LINE_SPAN;
    svg.setAttribute("width", right + widest(maps.key_tokens));
    svg.setAttribute("height", 24 + n * step);
    let html = "";
    w.forEach((row, t) => row.forEach((value, s) => {
      if (value < 0.01 || (focus !== null && focus !== t)) return;
      html += `<line x1="${left + 4}" y1="${14 + t * step}" x2="${right - 4}" y2="${14 + s * step}" ` +
        `stroke="#1d4ed8" stroke-opacity="${value.toFixed(3)}" stroke-width="${1 + 3 * value}"/>`;
    }));
    maps.query_tokens.forEach((token, t) => {
      html += `<text data-side="query" data-index="${t}" x="${left}" y="${18 + t * step}" text-anchor="end">${escapeHtml(token)}</text>`;
    });
    maps.key_tokens.forEach((token, s) => {
      html += `<text data-side="key" x="${right}" y="${18 + s * step}">${escapeHtml(token)}</text>`;
    });
    svg.innerHTML = html;
    svg.querySelectorAll('text[data-side="query"]').forEach((label) => {
      label.addEventListener("mouseenter", () => drawLines(w, maps, Number(label.dataset.index)));
      label.addEventListener("mouseleave", () => drawLines(w, maps, null));
      label.addEventListener("click", () => { state.query = Number(label.dataset.index); $("query").value = state.query; loadSteps(); });
    });
  }

  // Explore: one head's computation ----------------------------------------------------------------------------
  async function loadSteps() {
    if (!state.model || JSON.stringify(state.model.body) !== JSON.stringify(modelBody())) loadModel();
    const maps = currentMaps();
    const head = state.head === null ? 0 : state.head;
    const body = { ...pageText(), kind: maps.kind, layer: maps.layers[state.layer], head: maps.heads[head],
                   query: state.query };
    $("steps-where").textContent = `${maps.title}, layer ${body.layer}, head ${body.head}` +
      (state.head === null ? " (the mean has no single computation: head 0 shown)" : "");
    const steps = await latest("stepsAsked", "/api/step", body, (why) => {
      state.steps = null;
      $("steps").textContent = why;
    });
    if (!steps) return;
    state.steps = steps;
    drawSteps(steps);
  }

  const fmt = (x) => (x === null || x === undefined) ? "" : Number(x).toFixed(4);
  const vector = (v) => `[${v.map(fmt).join(", ")}]`;

  function drawSteps(s) {
    const dot = s.scale !== null;
    let html = `<p class="formula">1. query <b>${escapeHtml(s.query_token)}</b>: q = x W<sub>Q</sub> (head ${s.head}, ` +
      `d = ${s.head_dim})</p><p class="vector" id="step-q">q = ${vector(s.q)}</p>`;
    html += `<p class="formula">2. scores: ${dot ? "q · k, times the scale " + escapeHtml(s.scale_text) :
      "the " + s.score + " score of q and k"}; 3. the mask; 4. softmax over the visible keys; ` +
      `5. the output is the weighted sum of the values</p>`;
    html += `<table class="steps" id="step-table"><tr><th>key</th><th>k</th><th>q · k</th><th>score</th>` +
      `<th>mask</th><th>weight</th><th>v</th></tr>`;
    s.key_tokens.forEach((token, j) => {
      html += `<tr class="${s.mask[j] ? "" : "masked"}"><td>${j}: ${escapeHtml(token)}</td>` +
        `<td class="vector">${vector(s.k[j].slice(0, 4))}${s.k[j].length > 4 ? "…" : ""}</td>` +
        `<td>${fmt(s.dots[j])}</td><td>${fmt(s.scores[j])}</td><td>${s.mask[j] ? "visible" : "−∞"}</td>` +
        `<td>${fmt(s.weights[j])}</td><td class="vector">${vector(s.v[j].slice(0, 4))}${s.v[j].length > 4 ? "…" : ""}</td></tr>`;
    });
    html += `</table><p class="vector" id="step-output">output = Σ weight · v = ${vector(s.output)}</p>`;
    html += `<p class="note">${s.matches_model ? "These weights equal the model's own (the heatmap's row)." :
      "The model's own weights differ (a position bias this view leaves out): " + vector(s.model_weights)}</p>`;
    $("steps").innerHTML = html;
  }

  function escapeHtml(text) {  // for element text and quoted attributes alike (a token may hold a quote)
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;")
      .replace(/'/g, "&#39;");
  }

  // Explore: the next token --------------------------------------------------------------------------------------
  function softmax(logits) {
    const max = Math.max(...logits.filter(Number.isFinite));
    const e = logits.map((x) => Number.isFinite(x) ? Math.exp(x - max) : 0);
    const sum = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / sum);
  }

  // temperature, then top-k, then top-p, as generate/sampling.py (logits sorted, most likely first)
  function reshape(logits, temperature, topK, topP) {
    if (temperature === 0) return logits.map((_, i) => (i === 0 ? 1 : 0));
    let scaled = logits.map((x) => x / temperature);
    if (topK > 0 && topK < scaled.length) {
      const kth = scaled[topK - 1];
      scaled = scaled.map((x) => (x < kth ? -Infinity : x));
    }
    if (topP < 1) {
      const p = softmax(scaled);
      let before = 0;
      scaled = scaled.map((x, i) => { const drop = before >= topP; before += p[i]; return drop ? -Infinity : x; });
    }
    return softmax(scaled);
  }

  function settings() {
    const topK = Number($("topk").value);
    return { temperature: Number($("temperature").value), topK, topP: Number($("topp").value) };
  }

  function drawNext() {
    const next = state.data && state.data.next;
    $("next-panel").classList.toggle("hidden", !next);
    if (!next) return;
    const { temperature, topK, topP } = settings();
    $("temperature-value").textContent = temperature;
    $("topk-value").textContent = topK === 0 ? "all" : topK;
    $("topp-value").textContent = topP;
    const original = softmax(next.logits);
    const reshaped = reshape(next.logits, temperature, topK, topP);
    state.reshaped = reshaped;
    let html = "<tr><th>token</th><th>id</th><th colspan=2>model</th><th colspan=2>reshaped</th></tr>";
    for (let i = 0; i < Math.min(15, next.ids.length); i++) {
      html += `<tr><td>${escapeHtml(next.tokens[i])}</td><td>${next.ids[i]}</td>` +
        `<td><span class="bar" style="width:${(200 * original[i]).toFixed(1)}px"></span></td><td>${original[i].toFixed(4)}</td>` +
        `<td><span class="bar reshaped" style="width:${(200 * reshaped[i]).toFixed(1)}px"></span></td>` +
        `<td class="reshaped-p">${reshaped[i].toFixed(4)}</td></tr>`;
    }
    $("next").innerHTML = html;
  }

  function random() {  // mulberry32, seeded from the seed box: the same seed draws the same tokens
    let t = (state.seed += 0x6d2b79f5);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  async function generateOne() {
    const next = state.data.next;
    const p = state.reshaped;
    let pick = 0;
    if (settings().temperature > 0) {
      let u = random(), total = 0;
      for (pick = 0; pick < p.length - 1; pick++) { total += p[pick]; if (u < total) break; }
    }
    $("text").value += next.texts[pick];
    await analyze();
  }

  function drawClasses() {
    const classes = state.data && state.data.classes;
    $("classes-panel").classList.toggle("hidden", !classes);
    if (!classes) return;
    $("classes").innerHTML = Object.entries(classes).sort((a, b) => b[1] - a[1]).map(([label, p]) =>
      `<tr><td>${escapeHtml(label)}</td><td><span class="bar" style="width:${(300 * p).toFixed(1)}px"></span></td>` +
      `<td>${p.toFixed(4)}</td></tr>`).join("");
  }

  // Explore: the whole model at the query token (serve/model_view.py) ---------------------------------------------
  // A translator's view has two streams: the encoder's over the source (`view.source`), read at the query token
  // while the maps are the encoder's (else at its last), and the decoder's over the Target box's text (or the
  // model's own translation), read at the query token while the maps are the decoder's (else at its last).
  function modelBody() {
    const maps = currentMaps(), encoderMaps = state.info.translator && maps && maps.kind === "self";
    // a translation run's encoder maps pick a source token, its decoder's a target token
    return { ...pageText(), query: encoderMaps ? null : state.query, source_query: encoderMaps ? state.query : null };
  }

  async function loadModel() {
    const body = modelBody();
    const view = await latest("modelAsked", "/api/model", body, (why) => { $("flow").textContent = why; });
    if (!view) return;
    state.model = { ...view, text: body.text, body };
    drawModel(view);
  }

  const shape = (dims) => `(${dims.join(", ")})`;
  const percent = (x) => `${(100 * x).toFixed(1)}%`;
  const WRITES = ["attn", "cross_attn", "mlp"];  // the sublayers that add to the stream

  function drawModel(view) {
    const where = `at query token ${view.query}: ${view.tokens[view.query]}`;
    if (!view.source) {
      $("flow-where").textContent = where;
      $("flow").innerHTML = stagesHtml(view.stages, view.attribution);
    } else {
      const source = view.source, whose = view.target_given ? "the Target box's" : "the model's own translation's";
      $("flow-where").textContent = `decoder ${where}; encoder at source token ${source.query}: ` +
        source.tokens[source.query];
      $("flow").innerHTML = `<h3>Encoder: the source, read at token ${source.query}</h3>` +
        stagesHtml(source.stages, {}) + `<h3>Decoder: ${whose} tokens, read at token ${view.query}</h3>` +
        stagesHtml(view.stages, view.attribution);
    }
    const a = view.attribution;
    $("dla").innerHTML = a.reason ? `Direct logit attribution: not here. ${escapeHtml(a.reason)}` :
      `Direct logit attribution: logit(<b>${escapeHtml(a.answer)}</b>) − logit(<b>${escapeHtml(a.wrong)}</b>) = ` +
      `${fmt(a.total)} at the query token, the sum of the shares written beside each stage (the final norm's and ` +
      `the output layer's biases add ${fmt(a.shares.bias)}).`;
  }

  function stagesHtml(stages, attribution) {
    let html = "";
    for (const s of stages) {
      const numbers = [];
      if (WRITES.includes(s.stage)) {
        numbers.push(`writes |out| = ${fmt(s.norm)}, ${percent(s.share)} of the stream it adds to`);
      } else if (s.norm !== undefined) {
        numbers.push(`stream |x| = ${fmt(s.norm)}`);
      }
      if (s.lens) numbers.push(`logit lens: <b>${escapeHtml(s.lens.token)}</b> (p ${fmt(s.lens.p)})`);
      const shapes = s.weights_shape ? `weights ${shape(s.weights_shape)}, output ${shape(s.shape)}` : shape(s.shape);
      html += `<div class="stage ${s.stage}"><span class="stage-label">${escapeHtml(s.label)}</span> ` +
        `<code class="shape">${shapes}</code>` + (s.note ? `<div class="note">${escapeHtml(s.note)}</div>` : "") +
        (numbers.length ? `<div class="stage-numbers">${numbers.join(" · ")}</div>` : "");
      if (s.top) {
        html += `<table class="bars">` + s.top.map((t) => `<tr><td>${escapeHtml(t.token)}</td><td>${fmt(t.p)}</td>` +
          `<td><span class="bar" style="width:${Math.round(200 * t.p)}px"></span></td></tr>`).join("") + "</table>";
      }
      if (s.dla !== undefined) html += dlaLine(s, attribution);
      html += "</div>";
      if (WRITES.includes(s.stage)) html += `<div class="stage-plus">+ residual</div>`;
      else if (s !== stages[stages.length - 1]) html += `<div class="stage-arrow">↓</div>`;
    }
    return html;
  }

  // a stage's direct share of the logit difference, and an attention stage's bar per head (blue for, red against)
  function dlaLine(s, attribution) {
    const signed = (x) => `${x >= 0 ? "+" : "−"}${fmt(Math.abs(x))}`;
    let html = `<div class="stage-dla">direct logit attribution ${signed(s.dla)}`;
    if (s.dla_heads) {
      const heads = Object.entries(attribution.shares).filter(([name]) => name.includes(" head "));
      const scale = Math.max(...heads.map(([, x]) => Math.abs(x)), 1e-9);  // the largest head's bar is 60 px
      html += s.dla_heads.map((x, h) => `<span class="dla-head" title="head ${h}: ${signed(x)}">` +
        `<span class="bar${x < 0 ? " against" : ""}" style="width:${Math.round(60 * Math.abs(x) / scale)}px"></span>` +
        `h${h}</span>`).join("");
    }
    return html + "</div>";
  }

  // Explore: head importance and the logit lens (serve/inspect_view.py) ---------------------------------------------
  async function inspect() {
    const body = pageText();
    $("inspect-status").textContent = "ablating each head in turn…";
    const view = await latest("inspectAsked", "/api/inspect", body, (why) => { $("inspect-status").textContent = why; });
    if (!view) return;
    state.inspect = { ...view, text: body.text };
    $("inspect-status").textContent = `for: ${body.text.length > 60 ? body.text.slice(0, 60) + "…" : body.text}`;
    drawImportance(view.heads);
    drawLens(view.lens, view.lens_note);
  }

  function diverging(value) {  // white -> deep blue for a rise, -> red for a fall; value in [-1, 1]
    const v = Math.max(-1, Math.min(1, value));
    return v >= 0 ? colour(v) : `rgb(${Math.round(255 - 75 * -v)},${Math.round(255 - 220 * -v)},${Math.round(255 - 210 * -v)})`;
  }

  function drawImportance(heads) {
    const canvas = $("importance");
    const rows = heads.sites.length, columns = Math.max(...heads.scores.map((r) => r.length));
    const context = canvas.getContext("2d");
    context.font = "11px monospace";
    const left = 12 + Math.max(...heads.sites.map((site) => context.measureText(site).width)), top = 24;
    const cell = Math.max(12, Math.min(56, Math.floor(300 / columns)));
    canvas.width = left + columns * cell + 10;  // resizing the canvas clears it and its settings
    canvas.height = top + rows * cell + 10;
    context.fillStyle = "#fff";
    context.fillRect(0, 0, canvas.width, canvas.height);
    const max = Math.max(...heads.scores.flat().filter((v) => v !== null).map(Math.abs), 1e-12);
    context.textBaseline = "middle";
    heads.scores.forEach((row, i) => row.forEach((value, h) => {
      if (value === null) return;
      context.fillStyle = diverging(value / max);
      context.fillRect(left + h * cell, top + i * cell, cell - 1, cell - 1);
      if (cell >= 44) {  // the score in its cell, where it fits
        context.font = "10px monospace";
        context.fillStyle = Math.abs(value / max) > 0.55 ? "#fff" : "#1d2330";
        context.textAlign = "center";
        context.fillText(Number(value.toPrecision(2)), left + h * cell + cell / 2, top + i * cell + cell / 2);
      }
    }));
    context.fillStyle = "#1d2330";
    context.font = "11px monospace";
    context.textAlign = "right";
    heads.sites.forEach((site, i) => context.fillText(site, left - 6, top + i * cell + cell / 2));
    context.textAlign = "center";
    for (let h = 0; h < columns; h++) context.fillText(`head ${h}`.slice(cell >= 40 ? 0 : 5), left + h * cell + cell / 2, top - 10);
    const what = heads.metric === "loss" ? `the loss (${heads.baseline.toFixed(4)} unchanged) rises` :
      "the output moves (KL from the model's own)";
    $("importance-caption").textContent = `head importance, sublayer x head: how much ${what} when the head's ` +
      `output is zeroed (Michel et al. 2019); blue a rise, red a fall, the strongest ${Number(max.toPrecision(3))}`;
  }

  function drawLens(lens, note) {
    $("lens").classList.toggle("hidden", !lens);
    $("lens-caption").classList.toggle("hidden", !lens);
    if (!lens) { $("inspect-status").textContent += ` (no logit lens: ${note})`; return; }
    let html = `<tr><th></th>${lens.tokens.map((t) => `<th>${escapeHtml(t)}</th>`).join("")}</tr>`;
    lens.layers.forEach((layer, l) => {
      html += `<tr><th>${escapeHtml(layer)}</th>`;
      lens.tokens.forEach((_, t) => {
        const p = lens.p_answer[l][t];
        const tops = lens.top[l][t].map((token, k) => `${token} ${lens.top_p[l][t][k].toFixed(3)}`).join("\n");
        html += `<td class="${p > 0.5 ? "strong" : ""}" style="background:${colour(p)}" title="${escapeHtml(tops)}">` +
          `${escapeHtml(lens.top[l][t][0])}<small>${lens.rank[l][t]}</small></td>`;
      });
      html += "</tr>";
    });
    html += `<tr><th>answer</th>${lens.answer.map((t) => `<th>${escapeHtml(t)}</th>`).join("")}</tr>`;
    $("lens").innerHTML = html;
  }

  // Training: metrics.jsonl, followed live --------------------------------------------------------------------------
  async function pollTraining() {
    try {
      const answer = await api(`/api/training?since=${state.training.next}`);
      $("training-run").textContent = answer.run;
      $("training-status").textContent = answer.found ? `${state.training.records.length + answer.records.length} records` :
        "no metrics.jsonl yet: waiting for the run to write one";
      if (answer.records.length) {
        state.training.records.push(...answer.records);
        state.training.next = answer.next;
        if ($("tab-training").classList.contains("active")) drawCharts();
      }
    } catch (error) {
      $("training-status").textContent = error.message;
    }
    setTimeout(pollTraining, 2000);
  }

  function series() {  // every numeric field of the records, by kind (train, eval, ...): [name, [[step, value]]]
    const found = new Map();
    state.training.records.forEach((record, index) => {
      const step = Number.isFinite(record.step) ? record.step : index;
      for (const [name, value] of Object.entries(record)) {
        if (name === "step" || typeof value !== "number" || !Number.isFinite(value)) continue;
        const label = record.kind && record.kind !== "train" ? `${record.kind} ${name}` : name;
        if (!found.has(label)) found.set(label, []);
        found.get(label).push([step, value]);
      }
    });
    const first = ["loss", "eval loss", "lr", "tokens_per_s", "tokens/s"];
    return [...found.entries()].sort((a, b) => (first.indexOf(a[0]) + 1 || 99) - (first.indexOf(b[0]) + 1 || 99));
  }

  function drawCharts() {
    const box = $("charts");
    box.innerHTML = "";
    for (const [name, points] of series()) {
      const chart = document.createElement("div");
      chart.className = "chart";
      chart.innerHTML = `<h3></h3><canvas width="420" height="200"></canvas>`;
      chart.querySelector("h3").textContent = `${name} (last ${fmt(points[points.length - 1][1])})`;
      box.appendChild(chart);
      plot(chart.querySelector("canvas"), points);
    }
  }

  function plot(canvas, points) {
    const c = canvas.getContext("2d"), w = canvas.width, h = canvas.height, pad = 40;
    const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
    const [x0, x1] = [Math.min(...xs), Math.max(...xs)], [y0, y1] = [Math.min(...ys), Math.max(...ys)];
    const X = (x) => pad + (w - pad - 10) * (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5);
    const Y = (y) => h - pad + (pad + 10 - h) * (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5);
    c.fillStyle = "#fff"; c.fillRect(0, 0, w, h);
    c.strokeStyle = "#c8cfdc"; c.strokeRect(pad, 10, w - pad - 10, h - pad - 10);
    c.fillStyle = "#6b7385"; c.font = "10px monospace";
    c.fillText(Number(y1.toPrecision(3)), 2, 16); c.fillText(Number(y0.toPrecision(3)), 2, h - pad);
    c.fillText(`step ${x0}`, pad, h - pad + 14); c.fillText(`${x1}`, w - 40, h - pad + 14);
    c.strokeStyle = "#1d4ed8"; c.lineWidth = 1.5; c.beginPath();
    points.forEach(([x, y], i) => (i ? c.lineTo(X(x), Y(y)) : c.moveTo(X(x), Y(y))));
    c.stroke();
  }

  // Experiments ---------------------------------------------------------------------------------------------------
  async function loadExperiments() {
    const box = $("experiments");
    let list;
    try { list = await api("/api/experiments"); } catch (error) { box.textContent = error.message; return; }
    if (!list.length) { box.textContent = "No experiments' results found (serve with --experiments DIR)."; return; }
    box.innerHTML = list.map((e) => {
      const rows = e.rows || [];
      const columns = rows.length ? Object.keys(rows[0]) : [];
      const table = rows.length ? `<table><tr>${columns.map((c) => `<th>${escapeHtml(c)}</th>`).join("")}</tr>` +
        rows.map((r) => `<tr>${columns.map((c) => `<td>${escapeHtml(typeof r[c] === "number" ? Number(r[c].toPrecision(4)) : r[c])}</td>`).join("")}</tr>`).join("") +
        "</table>" : "";
      const plots = e.plots.map((p) => `<img alt="${escapeHtml(p)}" src="/api/experiments/${encodeURIComponent(e.name)}/${encodeURIComponent(p)}">`).join("");
      return `<div class="experiment"><h3>${escapeHtml(e.name)} <span class="verdict ${escapeHtml(e.verdict)}">${escapeHtml(e.verdict)}</span></h3>` +
        `<p>${escapeHtml(e.claim || "")}</p><p><b>${escapeHtml(e.key_number || "")}</b> ${escapeHtml(e.reason || "")}</p>${table}${plots}</div>`;
    }).join("");
  }

  // Explore: a sparse autoencoder's features (served with --sae) -------------------------------------------------
  async function readSae() {
    $("sae-status").textContent = "reading...";
    const answer = await latest("saeAsked", "/api/sae", pageText(), (why) => { $("sae-status").textContent = why; });
    if (!answer) return;
    state.sae = answer;
    $("sae-status").textContent = "";
    $("sae-where").textContent = `at ${answer.point}: ${answer.architecture}, ${answer.d_sae} features`;
    const strongest = answer.per_token.map((row) => (row.length ? row[0].activation : 0));
    const top = Math.max(...strongest, 1e-9);
    const box = $("sae-tokens");
    box.innerHTML = "";
    answer.tokens.forEach((token, i) => {
      const span = document.createElement("span");
      span.textContent = token;
      span.style.background = `rgba(29, 78, 216, ${(0.8 * strongest[i] / top).toFixed(3)})`;
      if (strongest[i] > 0.5 * top) span.style.color = "#fff";
      span.addEventListener("mouseenter", () => showSaeToken(i));
      box.appendChild(span);
    });
    showSaeToken(answer.tokens.length - 1);
  }

  function showSaeToken(index) {  // the token's most active features, the strongest one's contexts
    const answer = state.sae, row = answer.per_token[index];
    state.saeToken = index;
    document.querySelectorAll("#sae-tokens span").forEach((s, j) => s.classList.toggle("focus", j === index));
    const top = row.length ? row[0].activation : 1;
    $("sae-token-features").innerHTML = `<tr><th colspan="3">token ${index}: ${escapeHtml(answer.tokens[index])}</th></tr>` +
      (row.length ? row.map((e) => `<tr data-feature="${e.feature}"><td>feature ${e.feature}</td>` +
        `<td><span class="bar" style="width:${Math.round(120 * e.activation / top)}px"></span></td><td>${fmt(e.activation)}</td></tr>`).join("") :
        "<tr><td>no feature fires here</td></tr>");
    $("sae-token-features").querySelectorAll("tr[data-feature]").forEach((tr) =>
      tr.addEventListener("click", () => showSaeFeature(Number(tr.dataset.feature))));
    if (row.length) showSaeFeature(row[0].feature); else $("sae-contexts").textContent = "";
  }

  function showSaeFeature(feature) {
    state.saeFeature = feature;
    $("sae-token-features").querySelectorAll("tr[data-feature]").forEach((tr) =>
      tr.classList.toggle("chosen", Number(tr.dataset.feature) === feature));
    const saved = state.sae.features[String(feature)], box = $("sae-contexts");
    if (!saved) {
      box.textContent = state.sae.contexts_saved ? `feature ${feature} fired on none of the texts the SAE was evaluated on` :
        "this SAE was saved without its features' contexts (no features.json beside it)";
      return;
    }
    box.innerHTML = `<h3>feature ${feature}: fires on ${(100 * saved.frequency).toFixed(1)}% of the evaluation tokens; top contexts</h3>` +
      saved.top.map(([v, c]) => `<div class="sae-context"><code>${escapeHtml(c)}</code> <span class="note">${fmt(v)}</span></div>`).join("");
  }

  // Wiring ---------------------------------------------------------------------------------------------------------
  $("analyze").addEventListener("click", analyze);
  $("kind").addEventListener("change", () => { state.kind = Number($("kind").value); selectMaps(); });
  $("layer").addEventListener("change", () => { state.layer = Number($("layer").value); drawAttention(); });
  $("query").addEventListener("change", () => { state.query = Number($("query").value); loadSteps(); });
  for (const id of ["temperature", "topk", "topp"]) $(id).addEventListener("input", drawNext);
  $("seed").addEventListener("change", () => { state.seed = Number($("seed").value); });
  $("step-generate").addEventListener("click", generateOne);
  $("inspect").addEventListener("click", inspect);
  $("sae-read").addEventListener("click", readSae);

  async function start() {
    state.info = await api("/api/info");
    $("model-name").textContent = `${state.info.model} (${state.info.family}${state.info.task ? ", " + state.info.task : ""})`;
    $("target-box").classList.toggle("hidden", !state.info.translator);
    $("text").value = state.info.example;  // a text the run's tokenizer reads
    await analyze();
    pollTraining();
    inspect();  // the first text's panels; later texts on request (each head's ablation is a pass of the model)
    $("sae-panel").classList.toggle("hidden", !state.info.sae);
    if (state.info.sae) readSae();
  }
  window.attnkit = { state, headers, weights, reshape, softmax, analyze, inspect, focusPattern, readSae, showSaeToken,
                     ready: start() };
})();
