// The playground: chat and completion against the served run through its own OpenAI-shaped endpoints
// (/v1/chat/completions, /v1/completions), streamed as server-sent events, each token shaded by its probability
// (the API's logprobs: the model's own log-softmax, before the temperature and top_p reshape it).
// `window.attnkit.playground` exposes the state and `send` the tests drive.
(() => {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const state = { model: null, messages: [], replies: [], busy: false, abort: null };

  function settings() {  // the sampling settings as the API names them, read from the controls
    return { temperature: Number($("pg-temperature").value), top_p: Number($("pg-top-p").value),
             max_tokens: Number($("pg-max-tokens").value), seed: Number($("pg-seed").value) };
  }

  function request(mode, text) {  // the endpoint and the body for a chat turn or a completion of `text`
    const top = Number($("pg-top-logprobs").value);
    const body = { model: state.model, ...settings(), stream: $("pg-stream").checked };
    if (mode === "chat") {
      return ["/v1/chat/completions", { ...body, messages: [...state.messages, { role: "user", content: text }],
                                        logprobs: true, top_logprobs: top }];
    }
    return ["/v1/completions", { ...body, prompt: text, logprobs: top }];
  }

  // one choice's logprobs, chat's or completions' shape, as [{token, logprob, top: [[token, logprob], ...]}]
  function scored(logprobs) {
    if (!logprobs) return [];
    if (logprobs.content) {
      return logprobs.content.map((e) => ({ token: e.token, logprob: e.logprob,
                                            top: (e.top_logprobs || []).map((a) => [a.token, a.logprob]) }));
    }
    return logprobs.tokens.map((token, i) => ({ token, logprob: logprobs.token_logprobs[i],
                                                top: Object.entries((logprobs.top_logprobs || [])[i] || {}) }));
  }

  // the server-sent events of a streamed answer, each `data:` parsed, until [DONE]
  async function* events(response) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const data = buffer.slice(0, end).split("\n").filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).trimStart()).join("\n");
        buffer = buffer.slice(end + 2);
        if (data === "[DONE]") return;
        if (data) yield JSON.parse(data);
      }
    }
  }

  // Drawing ---------------------------------------------------------------------------------------------------------
  function turn(role, cls) {
    const box = document.createElement("div");
    box.className = `turn ${cls}`;
    const label = document.createElement("span");
    label.className = "role";
    label.textContent = role;
    box.appendChild(label);
    $("pg-transcript").appendChild(box);
    return box;
  }

  function visible(token) { return token.replace(/ /g, "␣").replace(/\n/g, "⏎"); }

  // a piece of a reply's text with its scored tokens: a span per token where their texts make up the piece, else one
  // span for the piece (a character split over tokens); text without probabilities is plain
  function addPiece(reply, text, entries) {
    reply.entries.push(...entries);
    reply.text += text;
    if (!text) return;  // tokens a stop string cut off: counted, not drawn
    if (!entries.length) { reply.view.body.append(text); return; }
    const whole = entries.map((e) => e.token).join("") === text;
    const groups = whole ? entries.map((e) => [e.token, [e]]) : [[text, entries]];
    for (const [piece, group] of groups) {
      const p = Math.exp(group.reduce((sum, e) => sum + e.logprob, 0));
      const span = document.createElement("span");
      span.className = "pg-token" + (p > 0.55 ? " strong" : "");
      span.textContent = piece;
      span.dataset.p = p;
      span.style.background = `rgba(29, 78, 216, ${(0.08 + 0.92 * p).toFixed(3)})`;
      span.addEventListener("mouseenter", () => showTip(span, group));
      span.addEventListener("mouseleave", () => $("pg-tip").classList.add("hidden"));
      reply.view.body.appendChild(span);
    }
  }

  function percent(logprob) { return `${(100 * Math.exp(logprob)).toPrecision(3)}%`; }

  function showTip(span, group) {  // each token's probability and its likeliest alternatives
    const tip = $("pg-tip");
    tip.innerHTML = "";
    for (const entry of group) {
      const table = document.createElement("table");
      const listed = entry.top.some(([t]) => t === entry.token);
      const rows = listed ? entry.top : [[entry.token, entry.logprob], ...entry.top];
      for (const [token, logprob] of rows) {
        const row = table.insertRow();
        row.className = token === entry.token ? "chosen" : "";
        row.insertCell().textContent = visible(token);
        row.insertCell().textContent = percent(logprob);
      }
      tip.appendChild(table);
    }
    const box = span.getBoundingClientRect();
    tip.style.left = `${box.left}px`;
    tip.style.top = `${box.bottom + 4}px`;
    tip.classList.remove("hidden");
  }

  function caption(reply, finish, seconds) {
    const s = reply.settings;
    const line = document.createElement("span");
    line.className = "settings";
    line.textContent = `temperature ${s.temperature} · top_p ${s.top_p} · max_tokens ${s.max_tokens}` +
      ` · seed ${s.seed}` +
      ` · ${reply.entries.length || "?"} tokens in ${seconds.toFixed(2)} s · finish_reason ${finish}` +
      (reply.entries.length ? "" : " · no probabilities in the answer");
    reply.view.box.appendChild(line);
  }

  // Sending ---------------------------------------------------------------------------------------------------------
  async function send() {
    if (state.busy) return;
    const mode = $("pg-mode").value;
    const text = $("pg-input").value;
    const [path, body] = request(mode, text);
    $("pg-status").textContent = "";
    if (mode === "chat") turn("user", "user").append(text);
    const view = { box: turn(mode === "chat" ? "assistant" : "completion", "reply"), body: null };
    const reply = { mode, settings: settings(), text: "", entries: [], finish: null, chunks: 0, view };
    if (mode === "completion") {
      const prompt = document.createElement("span");
      prompt.className = "prompt";
      prompt.textContent = text;
      view.box.appendChild(prompt);
    }
    view.body = document.createElement("span");
    view.box.appendChild(view.body);
    busy(true);
    const started = performance.now();
    try {
      const headers = { ...window.attnkit.headers, "Content-Type": "application/json" };
      const response = await fetch(path, { method: "POST", headers, body: JSON.stringify(body),
                                           signal: state.abort.signal });
      if (!response.ok) {
        const json = await response.json();
        throw new Error(json.error ? json.error.message : response.statusText);
      }
      if (body.stream) {
        for await (const chunk of events(response)) {
          if (chunk.error) throw new Error(chunk.error.message);
          reply.chunks += 1;
          for (const choice of chunk.choices) {
            addPiece(reply, (choice.delta ? choice.delta.content : choice.text) || "", scored(choice.logprobs));
            reply.finish = choice.finish_reason || reply.finish;
          }
        }
      } else {
        const choice = (await response.json()).choices[0];
        addPiece(reply, choice.message ? choice.message.content || "" : choice.text, scored(choice.logprobs));
        reply.finish = choice.finish_reason;
      }
      if (mode === "chat") {
        state.messages.push({ role: "user", content: text }, { role: "assistant", content: reply.text });
      }
    } catch (error) {
      $("pg-status").textContent = error.name === "AbortError" ? "stopped" : error.message;
      reply.finish = error.name === "AbortError" ? "stopped" : "error";
    } finally {
      caption(reply, reply.finish, (performance.now() - started) / 1000);
      const { view: _, ...record } = reply;  // the reply as the tests read it, without its elements
      state.replies.push(record);
      busy(false);
    }
  }

  function busy(on) {
    state.busy = on;
    state.abort = on ? new AbortController() : null;
    $("pg-send").disabled = on;
    $("pg-stop").disabled = !on;
  }

  function clear() {
    state.messages = [];
    $("pg-transcript").innerHTML = "";
    $("pg-status").textContent = "";
  }

  $("pg-send").addEventListener("click", send);
  $("pg-stop").addEventListener("click", () => state.abort && state.abort.abort());
  $("pg-clear").addEventListener("click", clear);
  $("pg-mode").addEventListener("change", () => {
    $("pg-input-label").textContent = $("pg-mode").value === "chat" ? "Message" : "Prompt";
  });

  window.attnkit.ready.then(() => {
    const info = window.attnkit.state.info;
    state.model = info.model;
    if (!info.methods.includes("generate")) {
      $("pg-body").classList.add("hidden");
      $("pg-unavailable").classList.remove("hidden");
      $("pg-unavailable").textContent = `This run (${info.family}${info.task ? ", " + info.task : ""}) does not ` +
        "generate text: the playground needs a language model, served at /v1/completions and /v1/chat/completions.";
    }
  });
  window.attnkit.playground = { state, send, clear };
})();
