#include "dlprobe/core/launcher.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace dlprobe {
namespace {

using Env = std::map<std::string, std::string>;

RankEnv read_ok(const Env& vars) {
  auto r = read_rank_env(map_env(vars));
  EXPECT_TRUE(r.has_value()) << r.status().message();
  return r.value_or(RankEnv{});
}

std::string read_error(const Env& vars) {
  auto r = read_rank_env(map_env(vars));
  EXPECT_FALSE(r.has_value());
  return r ? std::string() : r.status().message();
}

TEST(RankEnv, NoLauncherIsOneRank) {
  RankEnv r = read_ok({{"PATH", "/usr/bin"}});
  EXPECT_EQ(r.launcher, Launcher::none);
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.local_rank, 0);
}

TEST(RankEnv, Torchrun) {
  RankEnv r = read_ok({{"RANK", "5"},
                       {"WORLD_SIZE", "8"},
                       {"LOCAL_RANK", "1"},
                       {"MASTER_ADDR", "10.0.0.1"},
                       {"MASTER_PORT", "29500"}});
  EXPECT_EQ(r.launcher, Launcher::torchrun);
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.master_addr, "10.0.0.1");
  EXPECT_EQ(r.master_port, 29500);
}

TEST(RankEnv, OpenMpi) {
  RankEnv r = read_ok({{"OMPI_COMM_WORLD_RANK", "3"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                       {"MASTER_ADDR", "node1"}});
  EXPECT_EQ(r.launcher, Launcher::openmpi);
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.local_rank, 3);
  EXPECT_EQ(r.master_addr, "node1");
  EXPECT_FALSE(r.master_port);
}

TEST(RankEnv, MpichPmi) {
  RankEnv r = read_ok({{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}, {"MPI_LOCALRANKID", "0"}});
  EXPECT_EQ(r.launcher, Launcher::mpich);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_TRUE(r.master_addr.empty());
}

TEST(RankEnv, SlurmTakesRankZerosHostFromTheStepNodeList) {
  RankEnv r = read_ok({{"SLURM_PROCID", "9"},
                       {"SLURM_NTASKS", "16"},
                       {"SLURM_LOCALID", "1"},
                       {"SLURM_STEP_NODELIST", "gpu[007-008,010],login1"},
                       {"SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3"}});
  EXPECT_EQ(r.launcher, Launcher::slurm);
  EXPECT_EQ(r.rank, 9);
  EXPECT_EQ(r.world_size, 16);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.master_addr, "gpu007");
}

TEST(RankEnv, SlurmFallsBackToTheLaunchNode) {
  RankEnv r = read_ok({{"SLURM_PROCID", "1"},
                       {"SLURM_NTASKS", "2"},
                       {"SLURM_LOCALID", "0"},
                       {"SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3"}});
  EXPECT_EQ(r.master_addr, "10.1.2.3");
}

TEST(RankEnv, TheLauncherNearestTheProcessWins) {
  // torchrun inside a Slurm allocation: the workers' ranks are torchrun's.
  RankEnv r = read_ok({{"RANK", "2"},
                       {"WORLD_SIZE", "4"},
                       {"LOCAL_RANK", "2"},
                       {"MASTER_ADDR", "a"},
                       {"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "1"},
                       {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(r.launcher, Launcher::torchrun);
  EXPECT_EQ(r.rank, 2);
}

TEST(RankEnv, RejectsBadValuesNamingTheVariable) {
  EXPECT_EQ(
      read_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "a"}}),
      "RANK=4 is outside 0..3 (WORLD_SIZE=4, torchrun)");
  EXPECT_EQ(
      read_error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "a"}}),
      "RANK=-1 is outside 0..3 (WORLD_SIZE=4, torchrun)");
  EXPECT_EQ(read_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}, {"LOCAL_RANK", "0"}}),
            "WORLD_SIZE=0: the world needs at least one rank (torchrun)");
  EXPECT_EQ(read_error({{"RANK", "two"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}),
            "RANK='two' is not an integer (torchrun)");
  EXPECT_EQ(read_error({{"RANK", "1 "}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}),
            "RANK='1 ' is not an integer (torchrun)");
  EXPECT_EQ(read_error({{"RANK", ""}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}),
            "RANK='' is not an integer (torchrun)");
  EXPECT_EQ(read_error({{"OMPI_COMM_WORLD_RANK", "1"},
                        {"OMPI_COMM_WORLD_SIZE", "2"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                        {"MASTER_ADDR", "a"}}),
            "OMPI_COMM_WORLD_LOCAL_RANK=2 is outside 0..1 (OMPI_COMM_WORLD_SIZE=2, Open MPI)");
  EXPECT_EQ(
      read_error(
          {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"MASTER_PORT", "70000"}}),
      "MASTER_PORT=70000 is not a TCP port (1-65535)");
  EXPECT_EQ(read_error({{"SLURM_PROCID", "0"},
                        {"SLURM_NTASKS", "2"},
                        {"SLURM_LOCALID", "0"},
                        {"SLURM_STEP_NODELIST", "gpu[x]"}}),
            "SLURM_STEP_NODELIST='gpu[x]' is not a Slurm host list");
}

TEST(RankEnv, RejectsAHalfSetLauncher) {
  EXPECT_EQ(read_error({{"RANK", "0"}, {"LOCAL_RANK", "0"}}), "WORLD_SIZE is not set (torchrun)");
  EXPECT_EQ(read_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MASTER_ADDR", "a"}}),
            "MPI_LOCALRANKID is not set (MPICH/PMI)");
  EXPECT_EQ(read_error({{"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}}),
            "SLURM_PROCID is not set (Slurm)");
}

TEST(RankEnv, SeveralRanksNeedRankZerosAddress) {
  EXPECT_EQ(read_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}}),
            "WORLD_SIZE=2 ranks under torchrun but nothing names rank 0's host: set MASTER_ADDR");
  EXPECT_EQ(read_error({{"OMPI_COMM_WORLD_RANK", "0"},
                        {"OMPI_COMM_WORLD_SIZE", "2"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}),
            "OMPI_COMM_WORLD_SIZE=2 ranks under Open MPI but nothing names rank 0's host: set "
            "MASTER_ADDR");
  EXPECT_EQ(read_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}}),
            "SLURM_NTASKS=2 ranks under Slurm but nothing names rank 0's host: set MASTER_ADDR "
            "(or run inside a step: SLURM_STEP_NODELIST)");
}

TEST(SlurmHostList, FirstHost) {
  EXPECT_EQ(first_slurm_host("node1"), "node1");
  EXPECT_EQ(first_slurm_host("node1,node2"), "node1");
  EXPECT_EQ(first_slurm_host("gpu[01-04]"), "gpu01");
  EXPECT_EQ(first_slurm_host("gpu[3,5-6]"), "gpu3");
  EXPECT_EQ(first_slurm_host("rack[2]-gpu"), "rack2-gpu");
  EXPECT_EQ(first_slurm_host("gpu[]"), "");
  EXPECT_EQ(first_slurm_host("gpu[01-04"), "");
}

TEST(NcclBootstrap, CommIdFromTheLauncher) {
  RankEnv r;
  r.launcher = Launcher::torchrun;
  r.world_size = 2;
  r.master_addr = "10.0.0.1";
  r.master_port = 29500;
  // torchrun's store listens on MASTER_PORT, so NCCL takes the next one.
  EXPECT_EQ(nccl_comm_id(r, map_env({})).value(), "10.0.0.1:29501");
  EXPECT_EQ(nccl_comm_id(r, map_env({{"DLPROBE_NCCL_PORT", "40000"}})).value(), "10.0.0.1:40000");
  EXPECT_EQ(nccl_comm_id(r, map_env({{"NCCL_COMM_ID", "h:1"}})).value(), "h:1");
  EXPECT_EQ(nccl_comm_id(r, map_env({{"NCCL_COMM_ID", "h"}})).status().message(),
            "NCCL_COMM_ID='h' is not <address>:<port>");
  r.master_addr = "fe80::1";
  EXPECT_EQ(nccl_comm_id(r, map_env({})).value(), "[fe80::1]:29501");
  r.master_port = 65535;
  EXPECT_FALSE(nccl_comm_id(r, map_env({})));
  r.master_port.reset();
  r.master_addr = "gpu007";
  EXPECT_EQ(nccl_comm_id(r, map_env({{"SLURM_JOB_ID", "1234567"}})).value(), "gpu007:19567");
  EXPECT_EQ(nccl_comm_id(r, map_env({})).value(), "gpu007:29501");
  EXPECT_EQ(nccl_comm_id(r, map_env({{"DLPROBE_NCCL_PORT", "0"}})).status().message(),
            "DLPROBE_NCCL_PORT=0 is not a TCP port (1-65535)");
  r.master_addr.clear();
  EXPECT_FALSE(nccl_comm_id(r, map_env({})));
  r.world_size = 1;
  EXPECT_EQ(nccl_comm_id(r, map_env({})).value(), "127.0.0.1:29501");
}

TEST(Nvls, OffUnlessTheUserSetIt) {
  EXPECT_EQ(nccl_child_env(map_env({})), (Env{{"NCCL_NVLS_ENABLE", "0"}}));
  EXPECT_TRUE(nccl_child_env(map_env({{"NCCL_NVLS_ENABLE", "1"}})).empty());
}

TEST(Nvls, InProcessKeepsTheUsersValue) {
  const char* before = std::getenv("NCCL_NVLS_ENABLE");
  const std::string saved = before != nullptr ? before : "";
  unsetenv("NCCL_NVLS_ENABLE");
  EXPECT_TRUE(disable_nvls_in_process());
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  setenv("NCCL_NVLS_ENABLE", "1", 1);
  EXPECT_FALSE(disable_nvls_in_process());
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "1");
  if (before != nullptr)
    setenv("NCCL_NVLS_ENABLE", saved.c_str(), 1);
  else
    unsetenv("NCCL_NVLS_ENABLE");
}

}  // namespace
}  // namespace dlprobe
