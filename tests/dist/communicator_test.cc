// The MPI communicator, run by `mpirun -np 2` (tests/CMakeLists.txt): every collective against its
// definition, and a rank that does not join makes the other fail within the timeout, naming the
// collective, instead of hanging.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

Communicator& Comm() {
  static std::unique_ptr<Communicator> c = *MakeMpiCommunicator(30);
  return *c;
}

TEST(MpiCommunicatorTest, RunsUnderMpirunWithTwoRanks) { ASSERT_EQ(Comm().size(), 2) << "run with mpirun -np 2"; }

TEST(MpiCommunicatorTest, AllReduceSumsEveryElement) {
  Communicator& c = Comm();
  std::vector<float> x(1000);  // [1000]
  for (size_t i = 0; i < x.size(); ++i) x[i] = (c.rank() + 1) * static_cast<float>(i);
  ASSERT_TRUE(c.AllReduceSum(x.data(), x.size(), DType::kF32, "test").ok());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], 3.0f * i) << i;  // 1*i + 2*i
  EXPECT_EQ(c.AllReduceSum(x.data(), 4, DType::kBF16, "bf16").code(), absl::StatusCode::kUnimplemented);
}

TEST(MpiCommunicatorTest, AllGatherPutsRanksInOrder) {
  Communicator& c = Comm();
  std::vector<int32_t> mine(5, 10 * c.rank() + 7), all(10, -1);  // [5], [2, 5]
  ASSERT_TRUE(c.AllGather(mine.data(), 5 * sizeof(int32_t), all.data(), "test").ok());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(all[i], i < 5 ? 7 : 17) << i;
}

TEST(MpiCommunicatorTest, BroadcastTakesTheRootsBytes) {
  Communicator& c = Comm();
  std::vector<double> t(64, c.rank() == 1 ? 2.5 : -1.0);  // a tensor [64] from rank 1
  ASSERT_TRUE(c.Broadcast(t.data(), t.size() * sizeof(double), 1, "test").ok());
  for (double v : t) EXPECT_EQ(v, 2.5);
  EXPECT_TRUE(c.Barrier("test").ok());
}

TEST(MpiCommunicatorTest, MessagesOfAnyLengthFromRankZero) {
  Communicator& c = Comm();
  for (size_t len : {size_t{0}, size_t{1}, size_t{1000}, size_t{3} << 20}) {
    std::string msg = c.rank() == 0 ? std::string(len, 'a' + len % 26) : "stale";
    ASSERT_TRUE(c.BroadcastMessage(&msg, "test").ok());
    EXPECT_EQ(msg, std::string(len, 'a' + len % 26));
  }
}

// Last: it leaves the group broken.
TEST(MpiCommunicatorTest, ARankThatNeverJoinsFailsTheOtherWithinTheTimeout) {
  auto short_wait = MakeMpiCommunicator(0.5);
  ASSERT_TRUE(short_wait.ok());
  Communicator& c = **short_wait;
  if (c.rank() == 1) {
    ::sleep(2);  // late: rank 0 gives up first
    (void)c.Barrier("late");
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status st = c.Barrier("the test's barrier");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("rank 0 of 2: collective barrier 'the test's barrier'"), std::string::npos) << st;
  EXPECT_NE(st.message().find("timed out after"), std::string::npos) << st;
  EXPECT_GE(waited, 0.5);
  EXPECT_LT(waited, 1.5);
  // Broken from then on: later calls fail at once with the same error.
  float x = 1;
  EXPECT_EQ(c.AllReduceSum(&x, 1, DType::kF32, "after").code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace specula

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  specula::ShutdownMpi(true);
  return rc;
}
