#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "trainer/launch/slurm_env.hpp"

namespace geoloco::launch {
namespace {

EnvLookup fake_env(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

TEST(SlurmEnv, MappingTable) {
  const std::vector<int> counts = {2, 3, 1};  // paris, tokyo, sydney
  const std::vector<SitePlacement> want = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {1, 2}, {2, 0}};
  for (int g = 0; g < 6; ++g) {
    SitePlacement p = site_of_global_rank(g, counts);
    EXPECT_EQ(p.site_index, want[static_cast<size_t>(g)].site_index) << g;
    EXPECT_EQ(p.rank_in_site, want[static_cast<size_t>(g)].rank_in_site) << g;
  }
  EXPECT_THROW(site_of_global_rank(6, counts), InputError);
  EXPECT_THROW(site_of_global_rank(-1, counts), InputError);
  EXPECT_THROW(site_of_global_rank(0, std::vector<int>{2, 0}), InputError);
}

TEST(SlurmEnv, ReadsTheTaskVariables) {
  const std::vector<int> counts = {2, 3};
  auto p = env_rank_from_slurm(
      counts, fake_env({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "5"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"}}));
  EXPECT_EQ(p.global_rank, 3);
  EXPECT_EQ(p.world_size, 5);
  EXPECT_EQ(p.site_index, 1);
  EXPECT_EQ(p.rank_in_site, 1);
  EXPECT_EQ(p.local_id, 1);
  EXPECT_EQ(p.node_id, 1);
  auto q = env_rank_from_slurm(counts, fake_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "5"}}));
  EXPECT_EQ(q.local_id, -1);
  EXPECT_EQ(q.node_id, -1);
}

TEST(SlurmEnv, ErrorsNameTheProblem) {
  const std::vector<int> counts = {2, 3};
  auto msg = [&](std::map<std::string, std::string> vars) {
    try {
      env_rank_from_slurm(counts, fake_env(std::move(vars)));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg({{"SLURM_NTASKS", "5"}}).find("SLURM_PROCID is not set"), std::string::npos);
  EXPECT_NE(msg({{"SLURM_PROCID", "x1"}, {"SLURM_NTASKS", "5"}}).find("SLURM_PROCID='x1'"), std::string::npos);
  EXPECT_NE(msg({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}).find("Slurm started 4 tasks"), std::string::npos);
  EXPECT_NE(msg({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}).find("2 + 3 = 5"), std::string::npos);
}

}  // namespace
}  // namespace geoloco::launch
