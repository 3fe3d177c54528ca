// llm.c token shards: a header of 256 little-endian int32 -- header[0] = 20240520 (magic),
// header[1] = 1 (version), header[2] = token count -- followed by `count` uint16 tokens.
//
// A shard source is the concatenation, in sorted path order, of every shard named by a
// file, a directory (its *.bin files) or a glob pattern. Every shard is validated when it
// is opened (header, size, every token < vocab_size), so a bad file is reported up front
// as a FileError naming the file and the problem, never as a crash mid-run.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trainer/data/token_dataset.hpp"

namespace geoloco::trainer {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

// Expands `path`: a regular file -> itself; a directory -> its *.bin regular files; anything
// containing * ? or [ -> glob(3) matches. Sorted. Throws FileError when nothing matches.
std::vector<std::string> resolve_shard_paths(const std::string& path);

// Opens and validates every shard; tokens must be < vocab_size.
std::shared_ptr<const TokenStream> open_shard_stream(const std::string& path, int vocab_size);

// Validates one shard held in memory (header, size, every token < vocab_size) and returns
// its token count. FileError(path, problem) otherwise. Used by the opener and the fuzzer.
uint64_t validate_shard(std::span<const uint8_t> bytes, const std::string& path, int vocab_size);

// Writes one shard (for tests and data-preparation tools). Throws FileError on I/O failure.
void write_shard(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace geoloco::trainer
