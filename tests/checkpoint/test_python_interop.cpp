// Interoperability with the Python ecosystem, both directions, using Debian's torch/numpy
// (/usr/bin/python3; the `safetensors` package is not installed, so the script parses the
// format itself: 8-byte length, JSON header, numpy.frombuffer).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "tests/data/temp_dir.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"

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
  const auto py = dir.write("check.py", script);
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
assert meta["format"] == "geoloco-gpt2", meta
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
