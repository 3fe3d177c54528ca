// Byte-level text source: every byte of a raw file is one token (vocab 256). The file is
// memory-mapped once; no tokenizer, so any file (UTF-8 text or binary) is valid input.
#pragma once

#include <memory>
#include <string>

#include "trainer/data/token_dataset.hpp"

namespace geoloco::trainer {

inline constexpr int kByteVocab = 256;

// Throws FileError if the file cannot be opened or mapped.
std::shared_ptr<const TokenStream> open_text_stream(const std::string& path);

}  // namespace geoloco::trainer
