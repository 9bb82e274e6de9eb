// One direction's state word (sockets/src/flow.h): the fast paths of
// transmit() and receive() take a stream only while its word is exactly
// `channel`; every other state of the direction sends them the long way.
#include "flow.h"

#include <gtest/gtest.h>

namespace {
using vmmc::sockets::detail::flow;

TEST(Flow, AFreshDirectionIsOnTcpAndNotOnTheFastPath) {
  flow f;
  EXPECT_FALSE(f.switched());
  EXPECT_FALSE(f.on_channel());
  EXPECT_NE(f.load(), flow::channel);
}

TEST(Flow, OnlyASwitchedDirectionWithNothingElseToLookAtIsTheFastPath) {
  flow f;
  f.to_channel();
  EXPECT_EQ(f.load(), flow::channel);
  EXPECT_TRUE(f.on_channel());
  // Each of these alone sends the next call the long way.
  for (auto mark : {+[](flow& x) { (void)x.shut_down(); }, +[](flow& x) { x.note_end_due(); },
                    +[](flow& x) { x.close_records(); }, +[](flow& x) { x.note_stash(); },
                    +[](flow& x) { x.orphan(); }, +[](flow& x) { x.note_failure(); },
                    +[](flow& x) { x.to_tcp_again(); }}) {
    flow g;
    g.to_channel();
    mark(g);
    EXPECT_NE(g.load(), flow::channel);
    EXPECT_TRUE(g.switched());
  }
}

TEST(Flow, TheCarrierOnlyMovesForward) {
  flow f;
  f.to_channel();
  f.to_tcp_again();
  EXPECT_TRUE(f.reverted());
  EXPECT_FALSE(f.on_channel());
  f.to_channel();  // a late switch does not bring it back
  EXPECT_FALSE(f.on_channel());
  EXPECT_TRUE(f.switched());
}

TEST(Flow, ARefusedShutdownOrAnEndRecordThatCouldNotGoUndoesOnlyItsOwnMark) {
  flow f;
  f.to_channel();
  f.note_end_due();
  EXPECT_FALSE(f.shut_down());
  EXPECT_TRUE(f.shut_down());  // shut already
  f.shutdown_refused();
  EXPECT_FALSE(f.is_shut());
  f.close_records();
  EXPECT_TRUE(f.has(flow::records_closed));
  f.reopen_records();
  EXPECT_EQ(f.load(), flow::channel | flow::end_due);
}
}  // namespace
