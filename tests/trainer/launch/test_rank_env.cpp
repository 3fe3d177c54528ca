#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "core/error.hpp"
#include "trainer/launch/rank_env.hpp"

namespace geoloco::launch {
namespace {

EnvLookup env_of(const std::vector<std::pair<std::string, std::string>>& vars) {
  auto m = std::make_shared<std::map<std::string, std::string>>(vars.begin(), vars.end());
  return [m](const char* name) -> const char* {
    auto it = m->find(name);
    return it == m->end() ? nullptr : it->second.c_str();
  };
}

TEST(RankEnv, LocalProcessesEnumerateSitesInOrder) {
  auto procs = local_processes({{"paris", 2}, {"tokyo", 3}}, {"geoloco", "worker", "run.yaml"});
  ASSERT_EQ(procs.size(), 5u);
  const std::vector<std::string> labels = {"paris/0", "paris/1", "tokyo/0", "tokyo/1", "tokyo/2"};
  for (size_t i = 0; i < procs.size(); ++i) {
    EXPECT_EQ(procs[i].label, labels[i]);
    EXPECT_EQ(procs[i].argv, (std::vector<std::string>{"geoloco", "worker", "run.yaml"}));
    RankEnv e = RankEnv::from_env(env_of(procs[i].env));  // round trip through the env
    EXPECT_EQ(e.global_rank, static_cast<int>(i));
    EXPECT_EQ(e.world_size, 5);
    EXPECT_EQ(e.site, i < 2 ? "paris" : "tokyo");
    EXPECT_EQ(e.site_index, i < 2 ? 0 : 1);
    EXPECT_EQ(e.rank, i < 2 ? static_cast<int>(i) : static_cast<int>(i) - 2);
    EXPECT_EQ(e.site_size, i < 2 ? 2 : 3);
    // Same placement as Slurm's mapping for the same global rank.
    SitePlacement p = site_of_global_rank(e.global_rank, std::vector<int>{2, 3});
    EXPECT_EQ(p.site_index, e.site_index);
    EXPECT_EQ(p.rank_in_site, e.rank);
  }
}

TEST(RankEnv, RejectsBadSitesAndBadEnvironments) {
  EXPECT_THROW(local_processes({}, {"x"}), InputError);
  EXPECT_THROW(local_processes({{"a", 1}}, {}), InputError);
  EXPECT_THROW(local_processes({{"a", 0}}, {"x"}), InputError);
  EXPECT_THROW(local_processes({{"a", 1}, {"a", 1}}, {"x"}), InputError);
  EXPECT_THROW(local_processes({{"a/b", 1}}, {"x"}), InputError);
  auto good = RankEnv{"paris", 0, 1, 2, 1, 5, 1}.to_env();
  EXPECT_NO_THROW(RankEnv::from_env(env_of(good)));
  auto missing = good;
  missing.erase(missing.begin() + 2);  // GEOLOCO_RANK
  try {
    RankEnv::from_env(env_of(missing));
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("GEOLOCO_RANK is not set"), std::string::npos) << e.what();
  }
  auto bad_rank = good;
  bad_rank[2].second = "2";  // rank 2 of a 2-rank site
  EXPECT_THROW(RankEnv::from_env(env_of(bad_rank)), InputError);
  auto junk = good;
  junk[4].second = "1x";
  EXPECT_THROW(RankEnv::from_env(env_of(junk)), InputError);
}

}  // namespace
}  // namespace geoloco::launch
