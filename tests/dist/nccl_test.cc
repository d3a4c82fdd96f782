// The NCCL communicator under `mpirun -np N` (N = 1 and 2), one GPU per rank: every collective on
// device memory against its definition. Skipped (and reported so) with fewer GPUs than ranks.
#include <cuda_runtime.h>

#include <vector>

#include "dist/communicator.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

TEST(NcclCommunicatorTest, CollectivesOnDeviceMemory) {
  auto mpi = MakeMpiCommunicator(60);
  ASSERT_TRUE(mpi.ok()) << mpi.status();
  Communicator& boot = **mpi;
  if (NcclDeviceCount() < boot.size()) {
    GTEST_SKIP() << NcclDeviceCount() << " GPUs for " << boot.size() << " ranks";
  }
  cudaSetDevice(boot.rank());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto nccl = MakeNcclCommunicator(&boot, boot.rank(), stream);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  Communicator& c = **nccl;
  const int n = 1000, R = c.size();
  std::vector<float> host(n);  // [n]
  for (int i = 0; i < n; ++i) host[i] = (c.rank() + 1) * static_cast<float>(i);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, n * R * sizeof(float)), cudaSuccess);  // [R, n]
  cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  ASSERT_TRUE(c.AllReduceSum(dev, n, DType::kF32, "test").ok());
  cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost);
  const float total = R * (R + 1) / 2.0f;
  for (int i = 0; i < n; ++i) ASSERT_EQ(host[i], total * i) << i;
  // All-gather of each rank's id, then a broadcast from the last rank, then a barrier.
  std::vector<float> mine(n, static_cast<float>(c.rank())), all(n * R);
  cudaMemcpy(dev, mine.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  float* gathered = nullptr;
  ASSERT_EQ(cudaMalloc(&gathered, n * R * sizeof(float)), cudaSuccess);
  ASSERT_TRUE(c.AllGather(dev, n * sizeof(float), gathered, "test").ok());
  cudaMemcpy(all.data(), gathered, n * R * sizeof(float), cudaMemcpyDeviceToHost);
  for (int r = 0; r < R; ++r) EXPECT_EQ(all[r * n + 7], static_cast<float>(r));
  ASSERT_TRUE(c.Broadcast(dev, n * sizeof(float), R - 1, "test").ok());
  cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(host[5], static_cast<float>(R - 1));
  EXPECT_TRUE(c.Barrier("test").ok());
  cudaFree(dev);
  cudaFree(gathered);
}

}  // namespace
}  // namespace specula

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  specula::ShutdownMpi(true);
  return rc;
}
