// The chat page geist serve answers at "/": one self-contained HTML file (no build step,
// no CDN), talking to /v1/chat/completions with streaming. Model text is inserted as
// text nodes only, never as HTML.
#pragma once

namespace geist::serve {

inline constexpr char kChatPageHtml[] = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>geist</title>
<style>
body{font:15px/1.45 system-ui,sans-serif;margin:0;background:#f6f6f4;color:#222}
main{max-width:820px;margin:0 auto;padding:16px;display:flex;flex-direction:column;height:100vh;box-sizing:border-box}
h1{font-size:18px;margin:0 0 8px}
#sys,#msg{width:100%;box-sizing:border-box;font:inherit;padding:8px;border:1px solid #bbb;border-radius:6px}
#log{flex:1;overflow-y:auto;margin:10px 0;padding:8px;background:#fff;border:1px solid #ddd;border-radius:6px}
.m{white-space:pre-wrap;margin:6px 0;padding:6px 10px;border-radius:6px}
.user{background:#e4eefc}.assistant{background:#f0f0ec}.error{background:#fde4e4}
.row{display:flex;gap:8px;align-items:center;margin-top:6px}
button{font:inherit;padding:6px 14px}
#stats{color:#666;font-size:13px}
label{font-size:13px;color:#444}
input[type=number]{width:70px}
</style></head>
<body><main>
<h1>geist</h1>
<textarea id="sys" rows="2" placeholder="System prompt (optional)"></textarea>
<div id="log"></div>
<textarea id="msg" rows="3" placeholder="Message (Enter sends, Shift+Enter: new line)"></textarea>
<div class="row">
<button id="send">Send</button><button id="stop" disabled>Stop</button><button id="clear">Clear</button>
<label>temperature <input id="temp" type="number" step="0.1" min="0" max="2" value="0.7"></label>
<label>max tokens <input id="max" type="number" min="1" value="512"></label>
<label>API key <input id="key" type="password" size="10"></label>
</div>
<div id="stats"></div>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let history = [], controller = null;
function add(role, text) {
  const d = document.createElement("div");
  d.className = "m " + role;
  d.textContent = text;
  $("log").appendChild(d);
  $("log").scrollTop = $("log").scrollHeight;
  return d;
}
function busy(b) { $("send").disabled = b; $("stop").disabled = !b; }
async function send() {
  const text = $("msg").value.trim();
  if (!text || controller) return;
  $("msg").value = "";
  add("user", text);
  history.push({role: "user", content: text});
  const msgs = ($("sys").value.trim() ? [{role: "system", content: $("sys").value.trim()}] : []).concat(history);
  const out = add("assistant", "");
  controller = new AbortController();
  busy(true);
  let reply = "";
  const t0 = performance.now();
  let first = 0;
  try {
    const headers = {"Content-Type": "application/json"};
    if ($("key").value) headers["Authorization"] = "Bearer " + $("key").value;
    const r = await fetch("/v1/chat/completions", {method: "POST", headers, signal: controller.signal,
      body: JSON.stringify({messages: msgs, stream: true, stream_options: {include_usage: true},
        temperature: Number($("temp").value), max_tokens: Number($("max").value)})});
    if (!r.ok) {
      let m = r.status + " " + r.statusText;
      try { m = (await r.json()).error.message; } catch (e) {}
      throw new Error(m);
    }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
        const j = JSON.parse(ev.slice(6));
        if (j.error) throw new Error(j.error.message);
        for (const c of j.choices || []) {
          const piece = (c.delta && c.delta.content) || "";
          if (piece && !first) first = performance.now();
          reply += piece;
          out.textContent = reply;
          $("log").scrollTop = $("log").scrollHeight;
        }
        if (j.usage) {
          const u = j.usage, s = (performance.now() - t0) / 1000;
          $("stats").textContent = `prompt ${u.prompt_tokens} tokens (${u.prompt_tokens_details.cached_tokens} cached), ` +
            `reply ${u.completion_tokens} tokens, first token ${((first - t0) / 1000).toFixed(2)} s, total ${s.toFixed(2)} s`;
        }
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") { out.className = "m error"; out.textContent = reply + "\n[" + e.message + "]"; }
  }
  if (reply) history.push({role: "assistant", content: reply}); else history.pop();
  controller = null;
  busy(false);
}
$("send").onclick = send;
$("stop").onclick = () => { if (controller) controller.abort(); };
$("clear").onclick = () => { if (controller) controller.abort(); history = []; $("log").textContent = ""; $("stats").textContent = ""; };
$("msg").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); } });
</script>
</body></html>
)HTML";

}  // namespace geist::serve
