// The attention explorer page: data as JSON (weights base64 uint16) inside a fixed inline template.
#include "analysis/explorer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "tasks/seq2seq.h"

namespace headlab::analysis {

namespace {

std::string base64(const std::vector<uint8_t>& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = static_cast<uint32_t>(bytes[i]) << 16 | (i + 1 < bytes.size() ? bytes[i + 1] << 8 : 0) |
                       (i + 2 < bytes.size() ? bytes[i + 2] : 0);
    out += abc[n >> 18 & 63];
    out += abc[n >> 12 & 63];
    out += i + 1 < bytes.size() ? abc[n >> 6 & 63] : '=';
    out += i + 2 < bytes.size() ? abc[n & 63] : '=';
  }
  return out;
}

// The page; /*DATA*/ is replaced by the JSON. Canvas drawing keeps the DOM small for long prompts.
constexpr const char* kTemplate = R"HTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>headlab attention</title>
<style>
body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { overflow-wrap: anywhere; }
#controls { margin: 8px 0; } #link { color: #666; overflow-wrap: anywhere; }
#main { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
#view-box { max-height: 80vh; overflow-y: auto; border: 1px solid #ddd; }
#side { flex: 1 1 260px; min-width: 260px; }
#scores-box { overflow-x: auto; } table { border-collapse: collapse; } td, th { padding: 2px 8px; border-bottom: 1px solid #eee; text-align: left; }
#thumbs { display: grid; gap: 6px; margin-top: 12px; overflow-x: auto; } .thumb { text-align: center; cursor: pointer; font-size: 11px; }
.thumb canvas { border: 2px solid transparent; image-rendering: pixelated; } .thumb.sel canvas { border-color: #d33; }
/* A long prompt's row wraps within its box and scrolls there, never widening the page. */
#row { font-family: monospace; white-space: pre-wrap; overflow-wrap: anywhere; max-height: 50vh; overflow-y: auto; margin-top: 8px; }
</style></head><body>
<h1 id="title"></h1>
<div id="controls"><span id="kind-box">attention <select id="kind"></select></span>
 layer <select id="layer"></select> head <select id="head"></select> <span id="summary"></span></div>
<div id="link"></div>
<div id="main"><div id="view-box"><canvas id="view"></canvas></div>
<div id="side"><div id="scores-box"><table id="scores"></table></div><div id="row">hover a token on the left</div></div></div>
<div id="thumbs"></div>
<script>
"use strict";
const D = /*DATA*/;
const decode = b64 => { const s = atob(b64), u = new Uint16Array(s.length / 2);
  for (let i = 0; i < u.length; i++) u[i] = s.charCodeAt(2 * i) | (s.charCodeAt(2 * i + 1) << 8); return u; };
const ROW = 16, TOP = 24, XQ = 170, XK = 420;
let K, W, T, S;  // the kind of attention shown (an encoder-decoder has three), its weights, queries, keys
const weight = (l, h, q, k) => W[((l * K.heads + h) * T + q) * S + k] / K.scale;
const kept = (l, h) => K.kept[l].includes(h);
const name = (l, h) => `${K.layer_names[l]}H${h}`;
// The key/value group a head reads in a grouped-query model ("G1"), "" otherwise.
const group = h => K.kv_heads > 0 && K.kv_heads < K.heads ? ` G${Math.floor(h / (K.heads / K.kv_heads))}` : "";
const colour = (h, a) => `hsla(${Math.round(h * 360 / K.heads)}, 70%, 45%, ${a})`;
const state = { kind: 0, layer: 0, head: -1, hovered: -1 };
const $ = id => document.getElementById(id);
function heads() { return state.head >= 0 ? [state.head] : K.kept[state.layer]; }
function draw() {
  const c = $("view"), g = c.getContext("2d");
  c.width = 600; c.height = TOP + Math.max(T, S) * ROW + 8;
  g.clearRect(0, 0, c.width, c.height); g.font = "12px monospace"; g.textBaseline = "middle";
  const y = i => TOP + i * ROW + ROW / 2;
  for (let i = 0; i < T; i++) {
    g.fillStyle = i === state.hovered ? "#d33" : "#222";
    g.textAlign = "right"; g.fillText(K.tokens[i], XQ - 6, y(i));
  }
  g.fillStyle = "#222"; g.textAlign = "left";
  for (let k = 0; k < S; k++) g.fillText(K.key_tokens[k], XK + 6, y(k));
  g.fillStyle = "#888"; g.textAlign = "right"; g.fillText("query", XQ - 6, 10); g.textAlign = "left"; g.fillText("key", XK + 6, 10);
  const hs = heads();
  for (const h of hs)
    for (let q = 0; q < T; q++) {
      if (state.hovered >= 0 && q !== state.hovered) continue;
      for (let k = 0; k < S; k++) {
        const a = weight(state.layer, h, q, k) / hs.length;
        if (a < 0.01) continue;
        g.strokeStyle = colour(h, Math.min(1, a)); g.lineWidth = state.hovered >= 0 ? 2 : 1;
        g.beginPath(); g.moveTo(XQ, y(q)); g.lineTo(XK, y(k)); g.stroke();
      }
    }
  drawRow(); drawScores(); markThumbs(); share();
}
// The view in the address, named as its thumbnail is: #L1H3 (layer L1, head 3; an encoder-decoder's
// #cross.L0H2), #L1 (all of layer L1's heads overlaid), so that a link opens this view.
const view = () => K.layer_names[state.layer] + (state.head >= 0 ? `H${state.head}` : "");
let unknown = null;  // {name, shown}: an address that named no head here, said while its stand-in is shown
function share() {
  const here = view();
  if (unknown && unknown.shown !== here) unknown = null;
  if (decodeURIComponent(location.hash.slice(1)) !== here) history.replaceState(null, "", "#" + here);
  $("link").textContent = (unknown ? `#${unknown.name} names no head of this page (pruned or out of range). ` : "") +
    `link to this view: ${decodeURIComponent(location.pathname.split("/").pop())}#${here} ` +
    "(#L1H3 in the address opens layer L1, head 3; #L1 all of its heads overlaid)";
}
function openView(want) {  // the view an address names; false (and said) when it names none
  for (let i = 0; i < D.kinds.length; i++) {
    const k = D.kinds[i];
    for (let l = 0; l < k.layers; l++) {
      const rest = want.startsWith(k.layer_names[l]) ? want.slice(k.layer_names[l].length) : null;
      const h = rest === "" ? -1 : /^H[0-9]+$/.test(rest) ? +rest.slice(1) : null;
      if (h === null || (h >= 0 && !k.kept[l].includes(h))) continue;
      if (i !== state.kind) selectKind(i);
      select(l, h);
      return true;
    }
  }
  unknown = { name: want, shown: view() };
  share();
  return false;
}
function rowWeights() {  // the hovered query's weights per shown head: [{head, weights: [S]}]
  if (state.hovered < 0) return [];
  return heads().map(h => ({ head: h, weights: Array.from({ length: S }, (_, k) => weight(state.layer, h, state.hovered, k)) }));
}
function drawRow() {
  if (state.hovered < 0) { $("row").textContent = "hover a token on the left"; return; }
  const lines = [`query ${state.hovered} ${JSON.stringify(K.tokens[state.hovered])}`];
  for (const r of rowWeights()) {
    const top = r.weights.map((w, k) => [w, k]).sort((a, b) => b[0] - a[0]).slice(0, 8);
    lines.push(`head ${r.head}: ` + top.map(([w, k]) => `${k}:${JSON.stringify(K.key_tokens[k])} ${w.toFixed(3)}`).join("  "));
  }
  $("row").textContent = lines.join("\n");
}
function drawScores() {
  const t = $("scores"); t.innerHTML = "";
  const hs = heads(), head = document.createElement("tr");
  head.innerHTML = "<th>score</th>" + hs.map(h => `<th>${name(state.layer, h)}${group(h)}</th>`).join("");
  t.appendChild(head);
  for (const s of K.scores) {
    const tr = document.createElement("tr"), v = h => s.values[state.layer][h];
    tr.innerHTML = `<td>${s.name}</td>` + hs.map(h => `<td>${v(h) === null ? "" : (+v(h)).toFixed(4)}</td>`).join("");
    t.appendChild(tr);
  }
}
function thumbs() {
  const box = $("thumbs"), px = Math.max(1, Math.floor(96 / Math.max(T, S)));
  box.innerHTML = ""; box.style.gridTemplateColumns = `repeat(${K.heads}, max-content)`;
  for (let l = 0; l < K.layers; l++)
    for (let h = 0; h < K.heads; h++) {
      const div = document.createElement("div"); div.className = "thumb"; div.dataset.layer = l; div.dataset.head = h;
      const c = document.createElement("canvas"); c.width = S; c.height = T;
      c.style.width = `${S * px}px`; c.style.height = `${T * px}px`;
      const g = c.getContext("2d"), img = g.createImageData(S, T);
      for (let q = 0; q < T; q++) for (let k = 0; k < S; k++) {
        const v = kept(l, h) ? 255 - Math.round(255 * Math.sqrt(weight(l, h, q, k))) : 200, i = 4 * (q * S + k);
        img.data[i] = img.data[i + 1] = v; img.data[i + 2] = kept(l, h) ? 255 : 200; img.data[i + 3] = 255;
      }
      g.putImageData(img, 0, 0);
      div.appendChild(c); div.appendChild(document.createElement("br"));
      div.appendChild(document.createTextNode(`${name(l, h)}${group(h)}${kept(l, h) ? "" : " pruned"}`));
      if (kept(l, h)) div.onclick = () => select(l, h);
      box.appendChild(div);
    }
}
function markThumbs() {
  for (const d of document.querySelectorAll(".thumb"))
    d.classList.toggle("sel", +d.dataset.layer === state.layer && (state.head < 0 || +d.dataset.head === state.head));
}
function select(l, h) {
  state.layer = l; state.head = h; $("layer").value = l; fillHeads(); $("head").value = h; draw();
}
function fillHeads() {
  const s = $("head"); s.innerHTML = "";
  for (const h of K.kept[state.layer]) s.add(new Option(String(h), h));
  s.add(new Option("all (overlaid)", -1));
}
function hover(q) { state.hovered = q; draw(); }
function selectKind(i) {  // shows kind i from its first layer's first head
  state.kind = i; K = D.kinds[i]; W = K.decoded || (K.decoded = decode(K.weights)); T = K.T; S = K.S;
  state.layer = 0; state.head = K.kept[0].length ? K.kept[0][0] : -1; state.hovered = -1; $("kind").value = i;
  $("layer").innerHTML = "";
  for (let l = 0; l < K.layers; l++) $("layer").add(new Option(K.layer_names[l], l));
  const same = T === S && K.tokens.every((t, i) => t === K.key_tokens[i]);
  $("summary").textContent = `${K.kind}: ${same ? `${T} tokens` : `${T} queries x ${S} keys`}, ${K.layers} layers x ${K.heads} heads` +
    (group(0) ? ` reading ${K.kv_heads} key/value groups (G0: heads 0-${K.heads / K.kv_heads - 1}, ...)` : "");
  fillHeads(); thumbs(); draw();
}
$("title").textContent = D.title;
D.kinds.forEach((k, i) => $("kind").add(new Option(k.kind, i)));
$("kind-box").style.display = D.kinds.length > 1 ? "" : "none";
$("kind").onchange = e => selectKind(+e.target.value);
$("layer").onchange = e => { state.layer = +e.target.value; fillHeads(); state.head = +$("head").value; draw(); };
$("head").onchange = e => { state.head = +e.target.value; draw(); };
$("view").addEventListener("mousemove", e => {
  const r = e.target.getBoundingClientRect(), q = Math.floor((e.clientY - r.top - TOP) / ROW);
  const on = e.clientX - r.left < XQ && q >= 0 && q < T ? q : -1;
  if (on !== state.hovered) hover(on);
});
$("view").addEventListener("mouseleave", () => hover(-1));
const asked = decodeURIComponent(location.hash.slice(1));  // before the first view rewrites it
window.addEventListener("hashchange", () => {
  const want = decodeURIComponent(location.hash.slice(1));
  if (want !== view()) openView(want);
});
selectKind(0);
if (asked) openView(asked);
// (data: the kind shown)
window.headlab = { get data() { return K; }, kinds: D.kinds.length, state, weight, rowWeights, select, selectKind, hover,
                   view, openView, geometry: { ROW, TOP, XQ, XK } };
</script></body></html>
)HTML";

}  // namespace

namespace {

// One kind's part of the page's data: its maps (weights as base64 uint16), token text and scores.
nlohmann::json kind_json(const AttentionText& k, const std::vector<ExplorerScore>& scores) {
  const AttentionMaps& maps = *k.maps;
  const std::vector<std::string>& keys = checked_key_tokens("attention_explorer_html", maps, k.tokens, k.key_tokens);
  std::vector<uint8_t> bytes;
  bytes.reserve(maps.weights.size() * 2);
  for (float w : maps.weights) {  // pruned heads (NaN) as 0
    const auto v =
        static_cast<uint16_t>(std::isnan(w) ? 0.0 : std::lround(std::clamp<double>(w, 0, 1) * kExplorerWeightScale));
    bytes.push_back(static_cast<uint8_t>(v & 0xff));
    bytes.push_back(static_cast<uint8_t>(v >> 8));
  }
  nlohmann::json j = {{"kind", maps.kind},
                      {"layers", maps.layers},
                      {"heads", maps.heads},
                      {"kv_heads", maps.kv_heads},
                      {"layer_names", maps.layer_names},
                      {"T", maps.T},
                      {"S", maps.S},
                      {"tokens", k.tokens},
                      {"key_tokens", keys},
                      {"kept", maps.kept},
                      {"scale", kExplorerWeightScale},
                      {"weights", base64(bytes)}};
  j["scores"] = nlohmann::json::array();
  for (const ExplorerScore& s : scores) {
    HL_CHECK(static_cast<int64_t>(s.values.size()) == maps.layers, "attention_explorer_html: score ", s.name, " has ",
             s.values.size(), " layers, the maps ", maps.layers);
    nlohmann::json values = nlohmann::json::array();
    for (const auto& row : s.values) {
      nlohmann::json r = nlohmann::json::array();
      for (double v : row) r.push_back(std::isfinite(v) ? nlohmann::json(v) : nlohmann::json());
      values.push_back(r);
    }
    j["scores"].push_back({{"name", s.name}, {"values", values}});
  }
  return j;
}

std::string page_of(const std::string& title, const nlohmann::json& kinds) {
  HL_CHECK(!kinds.empty(), "attention_explorer_html: no attention to show");
  return page_with_data(kTemplate, {{"title", title}, {"kinds", kinds}});
}

void write_page(const std::string& path, const std::string& page) {
  io::write_file_atomic(path, page, "save_attention_html");
}

}  // namespace

std::string attention_explorer_html(const AttentionMaps& maps, const std::vector<std::string>& tokens,
                                    const std::string& title, const std::vector<ExplorerScore>& scores) {
  return attention_explorer_html({{"", &maps, tokens, {}}}, title, {scores});
}

std::string attention_explorer_html(const std::vector<AttentionText>& kinds, const std::string& title,
                                    const std::vector<std::vector<ExplorerScore>>& scores) {
  HL_CHECK(scores.empty() || scores.size() == kinds.size(), "attention_explorer_html: scores for ", scores.size(),
           " kinds of attention, the page has ", kinds.size());
  nlohmann::json all = nlohmann::json::array();
  for (size_t k = 0; k < kinds.size(); ++k)
    all.push_back(kind_json(kinds[k], scores.empty() ? std::vector<ExplorerScore>{} : scores[k]));
  return page_of(title, all);
}

void save_attention_html(const std::string& path, const AttentionMaps& maps, const std::vector<std::string>& tokens,
                         const std::string& title, const std::vector<ExplorerScore>& scores) {
  write_page(path, attention_explorer_html(maps, tokens, title, scores));
}

void save_attention_html(const std::string& path, const std::vector<AttentionText>& kinds, const std::string& title,
                         const std::vector<std::vector<ExplorerScore>>& scores) {
  write_page(path, attention_explorer_html(kinds, title, scores));
}

namespace {

// Scores of attention modules [first, first + layers) by [layer][original head], NaN where pruned.
std::vector<ExplorerScore> by_original_head(const nn::Model& model, int64_t first, int64_t layers,
                                            const std::vector<ExplorerScore>& scores) {
  std::vector<ExplorerScore> out;
  for (const ExplorerScore& s : scores) {
    HL_CHECK(static_cast<int64_t>(s.values.size()) == model.attention_count(), "save_row_explorer: score ", s.name,
             " has ", s.values.size(), " attention modules, the model ", model.attention_count());
    ExplorerScore& o = out.emplace_back();
    o.name = s.name;
    o.values.assign(static_cast<size_t>(layers),
                    std::vector<double>(static_cast<size_t>(model.full_heads()), std::nan("")));
    for (int64_t l = 0; l < layers; ++l) {
      const std::vector<double>& row = s.values[static_cast<size_t>(first + l)];
      for (size_t h = 0; h < row.size(); ++h)
        o.values[static_cast<size_t>(l)][static_cast<size_t>(model.original_head(first + l, static_cast<int64_t>(h)))] =
            row[h];
    }
  }
  return out;
}

}  // namespace

void save_row_explorer(const std::string& path, nn::Model& model, const tasks::Task& task, const Batch& batch,
                       int64_t row, const std::string& title, const std::vector<ExplorerScore>& scores) {
  HL_CHECK(row >= 0 && row < batch.B, "save_row_explorer: row ", row, " of a batch of ", batch.B);
  const auto text_of = [&](const std::vector<int64_t>& ids) {
    std::vector<std::string> tokens;
    for (int64_t id : ids) tokens.push_back(task.token_text(id));
    return tokens;
  };
  const auto first = batch.inputs.begin() + row * batch.T;
  if (auto* ed = model.as_encoder_decoder()) {
    const auto* s2s = dynamic_cast<const tasks::Seq2SeqTask*>(&task);
    HL_CHECK(s2s && batch.has_source(), "save_row_explorer: an encoder-decoder needs a seq2seq task's batch");
    // The row's source and its decoder input: bos and the target but its last token (answer_end of them).
    const auto src_first = batch.source.begin() + row * batch.S;
    const std::vector<int64_t> src(src_first, src_first + batch.source_valid_lens[static_cast<size_t>(row)]);
    const std::vector<int64_t> dec_in(first, first + batch.answer_end[static_cast<size_t>(row)]);
    const std::vector<AttentionMaps> kinds = attention_maps(*ed, src, dec_in);
    std::vector<std::string> source_tokens;
    for (int64_t id : src) source_tokens.push_back(s2s->decode_source({id}));
    const std::vector<std::string> target_tokens = text_of(dec_in);
    const std::vector<AttentionText> texts = {{"encoder", &kinds[0], source_tokens, {}},
                                              {"decoder", &kinds[1], target_tokens, {}},
                                              {"cross", &kinds[2], target_tokens, source_tokens}};
    const int64_t L = ed->config().num_layers;
    std::vector<std::vector<ExplorerScore>> by_kind;
    for (int64_t k = 0; k < 3; ++k) by_kind.push_back(by_original_head(model, k * L, L, scores));
    save_attention_html(path, texts, title, by_kind);
    return;
  }
  nn::DecoderModel* decoder = model.as_decoder();
  HL_CHECK(decoder, "save_row_explorer: a ", model.type_name(), " is neither a decoder nor an encoder-decoder");
  const int64_t len = batch.has_answers ? batch.answer_end[static_cast<size_t>(row)] + 1 : batch.T;
  const std::vector<int64_t> ids(first, first + len);
  save_attention_html(path, attention_maps(*decoder, ids), text_of(ids), title,
                      by_original_head(model, 0, model.attention_count(), scores));
}

std::string page_with_data(const std::string& page_template, const nlohmann::json& data) {
  // "</" inside the JSON (a token "</script>") would end the script element early.
  std::string text = data.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  for (size_t p = 0; (p = text.find("</", p)) != std::string::npos; p += 3) text.replace(p, 2, "<\\/");
  std::string page = page_template;
  page.replace(page.find("/*DATA*/"), 8, text);
  return page;
}

}  // namespace headlab::analysis
