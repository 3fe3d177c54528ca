// Interoperability with the Python ecosystem, both directions, using Debian's torch/numpy
// (/usr/bin/python3; the `safetensors` package is not installed, so the script parses the
// format itself: 8-byte length, JSON header, numpy.frombuffer). `transformers` is not
// installed either: a GPT-2 forward written from Hugging Face's GPT2LMHeadModel (driven only
// by config.json, as from_pretrained is) checks that geoloco's saved directory means the
// model geoloco computes, and that a directory laid out by save_pretrained loads into it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "tests/support/temp_dir.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "trainer/model/gpt.hpp"

using namespace geoloco;
using namespace geoloco::trainer;
using geoloco::test::TempDir;

namespace {

const char* kPython = "/usr/bin/python3";

bool python_has_torch() {
  // Importing torch takes seconds: ask once per process.
  static const bool ok = [] {
    const std::string cmd = std::string(kPython) + " -c 'import torch, numpy' >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
  }();
  return ok;
}

int run_python(const TempDir& dir, const std::string& script, const std::string& args) {
  const auto py = dir.file("check.py", script);
  const std::string cmd = std::string(kPython) + " " + py + " " + args;
  return std::system(cmd.c_str());
}

// Reads a safetensors file with numpy/torch and checks it against the C++ writer's contract.
const char* kReadScript = R"PY(
import json, struct, sys
import numpy as np
import torch

path, n_layer, n_embd, vocab, block = sys.argv[1], *map(int, sys.argv[2:6])
raw = open(path, "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert (8 + n) % 8 == 0, "data not 8-byte aligned"
header = json.loads(raw[8:8 + n].decode("utf-8"))
meta = header.pop("__metadata__")
assert meta["format"] == "pt" and meta["geoloco.format"] == "geoloco-gpt2", meta
assert int(meta["n_layer"]) == n_layer and int(meta["n_embd"]) == n_embd
assert int(meta["vocab_size"]) == vocab and int(meta["n_positions"]) == block
assert meta["step"] == "77"
data = raw[8 + n:]
C = n_embd
expect_shapes = {"transformer.wte.weight": [vocab, C], "transformer.wpe.weight": [block, C],
                 "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]}
for i in range(n_layer):
    p = f"transformer.h.{i}."
    expect_shapes.update({p + "ln_1.weight": [C], p + "ln_1.bias": [C],
                          p + "attn.c_attn.weight": [C, 3 * C], p + "attn.c_attn.bias": [3 * C],
                          p + "attn.c_proj.weight": [C, C], p + "attn.c_proj.bias": [C],
                          p + "ln_2.weight": [C], p + "ln_2.bias": [C],
                          p + "mlp.c_fc.weight": [C, 4 * C], p + "mlp.c_fc.bias": [4 * C],
                          p + "mlp.c_proj.weight": [4 * C, C], p + "mlp.c_proj.bias": [C]})
assert set(header) == set(expect_shapes), sorted(set(header) ^ set(expect_shapes))
state = {}
for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    assert e["dtype"] == "F32" and e["shape"] == expect_shapes[name], (name, e)
    b, end = e["data_offsets"]
    arr = np.frombuffer(data[b:end], dtype="<f4").reshape(e["shape"])
    state[name] = torch.from_numpy(arr.copy())
# The C++ test filled the flat buffer with value(i) = (i % 4093) * 0.125 - 100 in layout
# order, and the tensors are packed in that order, so flat index = byte offset / 4.
for name, e in header.items():
    b = e["data_offsets"][0] // 4
    n_el = int(np.prod(e["shape"])) if e["shape"] else 1
    want = ((np.arange(b, b + n_el) % 4093) * 0.125 - 100.0).astype(np.float32).reshape(e["shape"])
    assert torch.equal(state[name], torch.from_numpy(want)), name
# Conv1D layout [in, out]: x @ W works without a transpose.
x = torch.ones(1, C)
y = x @ state["transformer.h.0.attn.c_attn.weight"]
assert tuple(y.shape) == (1, 3 * C)
print("python read ok:", len(state), "tensors")
)PY";

// Writes a file from Python (little-endian, unpadded header) for the C++ reader.
const char* kWriteScript = R"PY(
import json, struct, sys
import numpy as np
import torch

path = sys.argv[1]
w = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 8 - 0.5
step = torch.tensor([7, -3], dtype=torch.int64)
mask = np.array([1, 0, 255], dtype=np.uint8)
blobs = [("w", "F32", list(w.shape), w.numpy().astype("<f4").tobytes()),
         ("step", "I64", [2], step.numpy().astype("<i8").tobytes()),
         ("mask", "U8", [3], mask.tobytes())]
header, off, data = {"__metadata__": {"writer": "python"}}, 0, b""
for name, dt, shape, raw in blobs:
    header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
    off += len(raw)
    data += raw
h = json.dumps(header).encode()
open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
)PY";

// GPT-2 as transformers' GPT2LMHeadModel computes it (modeling_gpt2.py: pre-LN blocks,
// Conv1D x @ W + b, attention scaled by 1/sqrt(head size) under a causal mask, the
// activation config.json names, LM head tied to wte), in float64, from a directory's
// config.json and model.safetensors alone.
//   check DIR TOKENS LOSSES: DIR is geoloco's; its per-position losses must match LOSSES.
//   export DIR TOKENS LOSSES: writes DIR as save_pretrained would (GPT2LMHeadModel names,
//     mask buffers, format "pt", HF's config.json) with its own random weights, and the
//     per-position losses it computes to LOSSES.
const char* kGpt2Script = R"PY(
import json, math, os, struct, sys
import numpy as np
import torch
import torch.nn.functional as F

mode, d, tokens_file, losses_file = sys.argv[1:5]
NP = {"F32": "<f4", "F16": "<f2", "BOOL": "?", "U8": "u1"}

def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    data = raw[8 + n:]
    sd = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        sd[name] = torch.from_numpy(np.frombuffer(data[b:end], dtype=NP[e["dtype"]]).reshape(e["shape"]).copy())
    return meta, sd

def write_safetensors(path, sd, meta):
    header, off, blobs = {"__metadata__": meta}, 0, []
    for name in sorted(sd):
        t = sd[name].contiguous()
        dt = {torch.float32: "F32", torch.bool: "BOOL"}[t.dtype]
        raw = t.numpy().tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

ACT = {"gelu_new": lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3)))),
       "gelu": lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))}

def gpt2_losses(cfg, sd, idx, targets):
    g = lambda n: sd[n if n in sd else n[len("transformer."):]].double()
    C, H, L, eps = cfg["n_embd"], cfg["n_head"], cfg["n_layer"], cfg["layer_norm_epsilon"]
    act = ACT[cfg["activation_function"]]
    B, T = idx.shape
    x = g("transformer.wte.weight")[idx] + g("transformer.wpe.weight")[torch.arange(T)]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        p = f"transformer.h.{i}."
        h = F.layer_norm(x, (C,), g(p + "ln_1.weight"), g(p + "ln_1.bias"), eps)
        q, k, v = (h @ g(p + "attn.c_attn.weight") + g(p + "attn.c_attn.bias")).split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-1, -2)
        if cfg.get("scale_attn_weights", True):
            att = att / math.sqrt(C // H)
        att = torch.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ g(p + "attn.c_proj.weight") + g(p + "attn.c_proj.bias")
        h = F.layer_norm(x, (C,), g(p + "ln_2.weight"), g(p + "ln_2.bias"), eps)
        h = act(h @ g(p + "mlp.c_fc.weight") + g(p + "mlp.c_fc.bias"))
        x = x + h @ g(p + "mlp.c_proj.weight") + g(p + "mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), g("transformer.ln_f.weight"), g("transformer.ln_f.bias"), eps)
    head = g("transformer.wte.weight") if cfg.get("tie_word_embeddings", True) else g("lm_head.weight")
    logits = x @ head.T
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), reduction="none")

shape_tokens = [int(v) for v in open(tokens_file).read().split()]
B, T = shape_tokens[:2]
ids = torch.tensor(shape_tokens[2:], dtype=torch.long).view(B, T + 1)
idx, targets = ids[:, :-1], ids[:, 1:]

if mode == "check":
    cfg = json.load(open(os.path.join(d, "config.json")))
    meta, sd = read_safetensors(os.path.join(d, "model.safetensors"))
    # What GPT2LMHeadModel.from_pretrained(d) needs of the directory.
    assert meta["format"] == "pt", meta  # transformers refuses any other format
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"], cfg
    assert cfg["n_positions"] == cfg["n_ctx"] == sd["transformer.wpe.weight"].shape[0], cfg
    assert list(sd["transformer.wte.weight"].shape) == [cfg["vocab_size"], cfg["n_embd"]], cfg
    assert cfg["tie_word_embeddings"] is True and "lm_head.weight" not in sd
    assert cfg["n_inner"] is None and cfg["activation_function"] == "gelu_new" and cfg["layer_norm_epsilon"] == 1e-5
    assert all(cfg[k] == 0 for k in ("attn_pdrop", "embd_pdrop", "resid_pdrop")), cfg
    assert 0 <= cfg["bos_token_id"] < cfg["vocab_size"] and 0 <= cfg["eos_token_id"] < cfg["vocab_size"], cfg
    ours = gpt2_losses(cfg, sd, idx, targets)
    theirs = torch.tensor([float(v) for v in open(losses_file).read().split()], dtype=torch.float64)
    diff = (ours - theirs).abs().max().item()
    print(f"torch from config.json: mean loss {ours.mean().item():.6f}, geoloco {theirs.mean().item():.6f}, "
          f"max |diff| per position {diff:.2e}")
    assert diff < 1e-4, diff
else:
    C, H, L, V, P = 24, 3, 2, 50, 16
    cfg = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
           "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
           "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": P, "n_embd": C, "n_head": H,
           "n_inner": None, "n_layer": L, "n_positions": P, "reorder_and_upcast_attn": False, "resid_pdrop": 0.1,
           "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True, "summary_activation": None,
           "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
           "summary_use_proj": True, "torch_dtype": "float32", "transformers_version": "4.41.2",
           "use_cache": True, "vocab_size": V}
    gen = torch.Generator().manual_seed(5)
    r = lambda *shape, s=0.3: (torch.rand(*shape, generator=gen) * 2 - 1) * s
    sd = {"transformer.wte.weight": r(V, C), "transformer.wpe.weight": r(P, C),
          "transformer.ln_f.weight": 1 + r(C), "transformer.ln_f.bias": r(C, s=0.1)}
    for i in range(L):
        p = f"transformer.h.{i}."
        sd.update({p + "ln_1.weight": 1 + r(C), p + "ln_1.bias": r(C, s=0.1),
                   p + "attn.c_attn.weight": r(C, 3 * C), p + "attn.c_attn.bias": r(3 * C, s=0.1),
                   p + "attn.c_proj.weight": r(C, C), p + "attn.c_proj.bias": r(C, s=0.1),
                   p + "ln_2.weight": 1 + r(C), p + "ln_2.bias": r(C, s=0.1),
                   p + "mlp.c_fc.weight": r(C, 4 * C), p + "mlp.c_fc.bias": r(4 * C, s=0.1),
                   p + "mlp.c_proj.weight": r(4 * C, C), p + "mlp.c_proj.bias": r(C, s=0.1),
                   p + "attn.bias": torch.tril(torch.ones(P, P, dtype=torch.bool)).view(1, 1, P, P),
                   p + "attn.masked_bias": torch.tensor(-1e4)})
    sd["lm_head.weight"] = sd["transformer.wte.weight"]  # tied: the same tensor
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "model.safetensors"), sd, {"format": "pt"})
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2, sort_keys=True)
    losses = gpt2_losses(cfg, sd, idx, targets)
    open(losses_file, "w").write(" ".join(repr(v) for v in losses.tolist()))
    print(f"torch export: mean loss {losses.mean().item():.6f}")
)PY";

// "B T" then B rows of T + 1 token ids (inputs and the next-token targets).
std::string write_tokens(const TempDir& dir, int B, int T, int vocab, std::vector<int32_t>* in,
                         std::vector<int32_t>* tg) {
  std::string text = std::to_string(B) + " " + std::to_string(T);
  in->assign(size_t(B) * T, 0);
  tg->assign(in->size(), 0);
  uint32_t x = 12345;
  for (int b = 0; b < B; ++b) {
    std::vector<int32_t> row(size_t(T) + 1);
    for (auto& t : row) {
      x = x * 1664525u + 1013904223u;
      t = static_cast<int32_t>((x >> 8) % uint32_t(vocab));
      text += " " + std::to_string(t);
    }
    std::copy(row.begin(), row.end() - 1, in->begin() + ptrdiff_t(b) * T);
    std::copy(row.begin() + 1, row.end(), tg->begin() + ptrdiff_t(b) * T);
  }
  return dir.file("tokens.txt", text);
}

}  // namespace

TEST(PythonInterop, TorchReadsOurModelCheckpoint) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " cannot import torch and numpy (Debian python3-torch)";
  TempDir dir;
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.block_size = 12;
  c.vocab_size = 40;
  ParamLayout L(c);
  std::vector<float> p(static_cast<size_t>(L.total()));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(i % 4093) * 0.125f - 100.0f;
  const auto path = dir.file("model.safetensors");
  save_model(path, L, p, {{"step", "77"}});
  EXPECT_EQ(run_python(dir, kReadScript, path + " 2 16 40 12"), 0);
}

TEST(PythonInterop, WeReadAFileWrittenByPython) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " cannot import torch and numpy (Debian python3-torch)";
  TempDir dir;
  const auto path = dir.file("py.safetensors");
  ASSERT_EQ(run_python(dir, kWriteScript, path), 0);
  auto f = read_safetensors(path);
  EXPECT_EQ(f.meta("writer"), "python");
  std::vector<float> want(12);
  for (int i = 0; i < 12; ++i) want[static_cast<size_t>(i)] = static_cast<float>(i) / 8 - 0.5f;
  EXPECT_EQ(f.f32("w"), want);
  EXPECT_EQ(f.info("w").shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(f.i64("step"), (std::vector<int64_t>{7, -3}));
  EXPECT_EQ(f.u8("mask"), (std::vector<uint8_t>{1, 0, 255}));
}

// geoloco's saved directory, read by PyTorch with config.json's hyperparameters only, is the
// model geoloco computes: the same per-position losses on the same tokens.
TEST(PythonInterop, TorchRunsOurSavedDirectoryFromItsConfigJson) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " cannot import torch and numpy (Debian python3-torch)";
  TempDir dir;
  const ModelConfig c{.n_layer = 2, .n_head = 4, .n_embd = 32, .block_size = 16, .vocab_size = 64};
  Gpt model(c, KernelPath::Reference);
  std::vector<float> p(static_cast<size_t>(model.layout().total()));
  Gpt::init_params(model.layout(), p, 3);
  // Weights far from init (LayerNorm gains and biases too), so every hyperparameter and
  // the activation shape the losses: init's tiny weights would hide a wrong n_head.
  uint32_t x = 7;
  for (auto& v : p) {
    x = x * 1664525u + 1013904223u;
    v += (float((x >> 8) & 0xffff) / 65535.0f * 2 - 1) * 0.3f;
  }
  const std::string out = (dir.path() / "step").string();
  std::filesystem::create_directories(out);
  save_model_directory(out, model.layout(), p, {{"geoloco_step", "5"}});
  std::vector<int32_t> in, tg;
  const std::string tokens = write_tokens(dir, 3, 16, c.vocab_size, &in, &tg);
  model.evaluate(p, in.data(), tg.data(), 3, 16);
  std::string losses;
  for (float l : model.losses()) losses += fmt::format("{:.9g} ", l);
  EXPECT_EQ(run_python(dir, kGpt2Script, "check " + out + " " + tokens + " " + dir.file("losses.txt", losses)), 0);
}

// A directory PyTorch writes in save_pretrained's layout (GPT2LMHeadModel names, mask
// buffers, lm_head the same tensor as wte, HF's config.json) loads through what eval uses
// and computes what PyTorch computed.
TEST(PythonInterop, WeRunADirectoryTorchWroteInSavePretrainedLayout) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " cannot import torch and numpy (Debian python3-torch)";
  TempDir dir;
  std::vector<int32_t> in, tg;
  const std::string tokens = write_tokens(dir, 2, 16, 50, &in, &tg);
  const std::string out = (dir.path() / "hf").string();
  const std::string losses = dir.file("losses.txt");
  ASSERT_EQ(run_python(dir, kGpt2Script, "export " + out + " " + tokens + " " + losses), 0);
  const std::string path = find_model_file(out);
  const auto f = read_safetensors(path);
  const ModelConfig c = read_model_config(f);
  EXPECT_EQ(c, (ModelConfig{.n_layer = 2, .n_head = 3, .n_embd = 24, .block_size = 16, .vocab_size = 50}));
  Gpt model(c, KernelPath::Reference);
  std::vector<float> p(static_cast<size_t>(model.layout().total()));
  load_model(f, model.layout(), p);
  model.evaluate(p, in.data(), tg.data(), 2, 16);
  std::ifstream want(losses);
  double max_diff = 0;
  for (float l : model.losses()) {
    double w = 0;
    ASSERT_TRUE(want >> w);
    max_diff = std::max(max_diff, std::abs(double(l) - w));
  }
  std::printf("geoloco from torch's export: max |diff| per position %.2e\n", max_diff);
  EXPECT_LT(max_diff, 1e-4);
}
