// Shared-memory transport between ranks of one node (host buffers).
//
// Each rank owns one segment in /dev/shm holding, for every local peer, two
// single-producer rings written by that peer: a data ring (eager messages and
// pipelined fragments, matched in order to receives) and a control ring
// (completions, collective status, goodbyes), which is always drained so a
// completion is never stuck behind data nobody has asked for yet.
//
// Protocols, chosen per message by the sender:
//  - eager / copy: fragments through the data ring (two copies, pipelined);
//  - cma: the sender posts its buffer's address, the receiver pulls the bytes
//    with process_vm_readv straight into its buffer (one copy) and answers
//    with a FIN (a reducing receive pulls slices and reduces each into its
//    buffer while it is in cache). A long message is read a piece (2 MiB)
//    per progress pass, so that the receiver's other peers, its network
//    and what it relays move between pieces. Used above ZP_SHM_EAGER when the receiver
//    could read this process's memory at init (ptrace rules allow it).
//    Receives of a reduce group (OpReduceGroup) wait until every member's
//    sender has offered its buffer, then are read a piece of each at a time
//    and reduced together. A message its receiver reduces (Op::reducedByPeer)
//    goes by copy from ZP_SHM_REDUCE_COPY on: the two copies pipeline, the
//    sender copying while the receiver reduces, where single copy leaves
//    both the read and the reduction to the receiver.
//
// Waiting: a rank polls its rings for new records for a while, then sleeps
// on a futex in its segment ("doorbell"). A writer bumps the doorbell only
// when the reader sleeps (or waits for room the writer freed): the bump is a
// cache line moving between the two, on top of the record's own. So idle
// ranks use no CPU, even with more ranks than cores, and a polling reader
// gets a small message as one line. It polls long only while every runnable
// task of the machine has a core (shm_wait.cc). A rank that also waits for
// the network sleeps in poll() on the network's event fd and its "bell", a
// datagram socket a writer sends a byte to instead of the futex wake, so
// that news from either side wakes it at once.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "include/zeppelin.h"
#include "src/core/transport.h"
#include "transport/shm/spin_plan.h"

namespace zp {

struct SegHeader;
struct RingCtl;
struct MsgHdr;

struct Ring {
  RingCtl* ctl = nullptr;
  char* buf = nullptr;
  uint64_t cap = 0;
  uint64_t pendingPos = 0;       // producer: where the claimed record starts
  uint64_t pendingPad = 0;       // producer: the pad before it (bytes)
  uint64_t tailSeen = 0;         // producer: the consumer's tail when last read
  uint64_t parked = 0;           // consumer: the stamp of a record left at the tail (atomic access: ringFresh)
};

// One lane (src/core/transport.h) between a pair: its rings and its queues,
// in order.
struct Lane {
  Ring out, in;  // out: in the peer's segment, written here; in: the reverse
  std::deque<Op*> sendq, recvq;
  // Single-copy sends waiting for the receiver's FIN, in seq order: fins
  // come in that order (a reduced group's may not: they are looked up).
  std::deque<Op*> finWait;
  // A mismatched message being skipped: the bytes still to skip.
  bool discarding = false;
  uint64_t discardLeft = 0;
};

class ShmTransport : public CarrierTransport {
 public:
  // Collective among the ranks of this node, in two steps. create: this
  // rank's segment, its pages reserved in /dev/shm (a page tmpfs cannot
  // back kills the process with SIGBUS when first touched). The
  // communicator does this before the ranks' last bootstrap round, so that
  // a rank that cannot (no room in /dev/shm) tells every rank there.
  static zpResult_t create(const TransportContext& ctx, std::unique_ptr<ShmTransport>* out);
  // The segment has no name in /dev/shm (so a killed job leaves nothing
  // there): the peers open it through /proc/<pid>/fd/<fd>, its owner keeping
  // the descriptor open until every local peer has mapped it.
  // After that round, when every local peer's segment exists: maps every
  // peer's, and returns once all have mapped each other. ringBytes: every
  // rank's ZP_SHM_RING_BYTES, fds: every rank's segment's descriptor, from
  // that round.
  zpResult_t connect(const std::vector<uint64_t>& ringBytes, const std::vector<int64_t>& fds);
  // The same from every rank's address (address()).
  zpResult_t connect(const std::vector<std::string>& addresses) override;
  // What the peers need: this rank's ZP_SHM_RING_BYTES and its segment's descriptor.
  std::string address() const;
  ~ShmTransport();

  void post(Op* op) override;
  // Messages that fit one record of the ring (meta included) and go by
  // copy, with peers nothing is queued with: a send is written into the
  // ring, a receive takes its record if it has come, polled for up to
  // kMoveNowPollUs (where ranks outnumber cores, each poll yields the
  // core, and only where the general wait would poll so too). The whole
  // call of a small message is then a record written and a record read,
  // without the queues, the executor's passes and the doorbell's
  // bookkeeping.
  void moveNow(const std::vector<Op*>& ops, std::vector<uint64_t>& sendSeq, std::vector<uint64_t>& recvSeq) override;
  static constexpr int kMoveNowPollUs = 20;
  // Receives reduce while they copy: from the ring's fragments, or from the
  // sender's memory in slices that stay in cache (see progressRecv).
  bool canReduce() const override { return true; }
  // From a peer that sends such messages by single copy: the group's
  // members are read and reduced together (runGroups).
  bool canReduceGroup(int peer, size_t bytes) const override;
  // Groups this process has reduced (for tests: that a path was taken).
  static long groupsReduced();
  // Messages this process offered its receivers to read (single copy).
  static long singleCopySends();
  // Sends and receives this process finished in moveNow (for tests: that
  // small messages took the shortcut). Counted with a load and a store, not
  // a locked add: exact for calls from one thread.
  static long opsMovedNow();
  // Where ranks outnumber cores: receives moveNow took after yielding the
  // core at least once, and its calls whose wait plan (spinPlan) was not a
  // yielding poll, so it left the receive to the general path (for tests).
  static long receivesTakenYielding();
  static long yieldingPollsDeclined();
  // The cores the node's ranks may run on, as this process's latest
  // communicator counted them at init (coresOfMasks; for tests).
  static int nodeCoresCounted();
  // Waits among other tasks filling the cores that slept at once because a
  // local peer last waited on this rank's CPU (peerOnMyCore; for tests).
  static long sleepsForAPeerOnTheCore();
  void sendStatus(int peer, uint64_t collSeq, zpResult_t status, const std::string& text) override;
  // The head of peer's ring of calls, while no receive waits for it.
  bool arrived(int peer, uint64_t seq, size_t* bytes) override;
  bool progress() override;
  bool busy() const override;
  // Local peers whose messages on lane wait unread in this rank's rings.
  std::vector<int> waitingOn(int lane) override;
  // Waiting (Transport): a doorbell.
  Wakeup wakeup() const override { return Wakeup::kDoorbell; }
  void waitDoorbell(uint32_t token, int ms, const std::function<bool()>& elsewhere, int fd, bool poll) override {
    wait(token, ms, elsewhere, fd, poll);
  }
  bool sleepDoorbell(uint32_t token, int ms, int fd) override {
    return fd >= 0 && bellWorks_ ? sleepWith(token, ms, fd) : sleep(token, ms);
  }
  bool sleepsWithFd() const override { return bellWorks_; }
  // A token that changes whenever a peer signals this rank.
  uint32_t waitToken() const override;
  // Sleeps until the token differs from `token` or ms pass; then checks that
  // local peers are still alive. While it polls (first, if `poll`), it also
  // stops as soon as `elsewhere` (news from another transport) holds; with
  // fd >= 0 and a bell that works (sleepsWithFd), its sleep also ends when fd
  // becomes readable.
  void wait(uint32_t token, int ms, const std::function<bool()>& elsewhere = {}, int fd = -1, bool poll = true);
  // Only the sleep (safe without the communicator's lock): it returns at
  // once if a record came that nobody has looked at; false if the time ran out.
  bool sleep(uint32_t token, int ms);
  // The same in poll() on the bell and fd (needs bellWorks_).
  bool sleepWith(uint32_t token, int ms, int fd);
  void dropOps(zpResult_t status, const std::string& why) override;
  void abortPeers(zpResult_t code, const std::string& why) override;
  void leave() override;
  std::vector<int> busyPeers() const override;
  // Fails everything pending with a local peer whose process has exited.
  void checkAlive() override;
  std::string describe(int peer) const override;
  // Kept in the segment so the node's ranks can read it.
  void addSharedWord(int index, int64_t delta) override;
  uint64_t sharedWord(int rank, int index) const override;

 private:
  struct Peer {
    int rank = -1;
    int localIdx = -1;
    pid_t pid = 0;
    int pidfd = -1;
    int segFd = -1;            // its segment's descriptor in its process
    std::string segPath;       // where this rank opens it: /proc/<pid>/fd/<segFd>
    SegHeader* seg = nullptr;  // the peer's segment, mapped here
    size_t segBytes = 0;
    Lane lane[kLanes];
    Ring outCtrl;              // in the peer's segment, written by this rank
    Ring inCtrl;               // in this rank's segment, written by the peer
    bool cma = false;          // the peer reads large messages from this rank directly
    bool dirty = false;        // wrote to the peer since the last notify: ring if it sleeps
    bool wake = false;         // freed room it waits for: ring in any case
    bool gone = false;
    bool bye = false;  // the peer left: what it sent before is still in the ring
    zpResult_t goneCode = zpSuccess;
    std::string goneWhy;
    std::deque<std::vector<char>> ctrlBacklog;  // control records waiting for ring space
    sockaddr_un bell = {};  // its bell socket's address
    socklen_t bellLen = 0;
  };

  // A reduce group's members whose senders offered their buffers (RTS), and
  // all its posted ops.
  struct GroupMember {
    int rank, lane;
    uint64_t seq, addr;
    Op* op;
  };
  struct GroupWait {
    std::vector<GroupMember> in;
    std::vector<Op*> ops;
  };
  // Reduces every group whose members have all arrived, and ends every
  // group one of whose members failed; true if any ended.
  bool runGroups();
  zpResult_t reduceGroup(const OpReduceGroup& g, GroupWait& w, std::string* why);
  static bool hasWork(const Peer& p);
  // Whether this rank waits for a single-copy transfer (a peer reading
  // this rank's memory, or this rank waiting to read a peer's).
  bool waitsForSingleCopy() const;
  // How a waiter polls before it sleeps (planSpin, from the machine's
  // runnable tasks and this node's ranks; shm_wait.cc).
  SpinPlan spinPlan() const;
  // planSpin's view of the machine: its runnable tasks, cores, and this
  // node's ranks and how many of them sleep (sampleLoad).
  SpinInputs loadInputs() const;
  // Reads the machine's runnable tasks and counts the node's sleeping ranks
  // into load_, unless that was done in the last 10 ms.
  void sampleLoad() const;
  // Adds a wait of `us` (until news came, polls and sleep together) to the
  // running mean spinPlan reads.
  void noteWait(uint64_t us);
  // Where other tasks fill the cores: publishes the CPU this rank waits
  // on (SegHeader::waitCpu) and says whether a local peer last waited on
  // the same one (counted: sleepsForAPeerOnTheCore()).
  bool peerOnMyCore() const;
  explicit ShmTransport(const TransportContext& ctx) : ctx_(ctx) {}
  zpResult_t init();
  // A rank's segment's name in /dev/shm, for the moment it has one where
  // O_TMPFILE is not supported (createUnnamed).
  std::string segName(int rank) const;
  // This rank's segment, as a file of /dev/shm without a name: *fd.
  zpResult_t createUnnamed(int* fd);
  // What a rank's segment holds in SegHeader::owner (from the id's secret
  // and the rank): a segment opened through /proc is checked to be it.
  uint64_t ownerKey(int rank) const;
  // Maps p's segment and checks that it matches this rank's.
  zpResult_t mapPeer(Peer& p);
  // This rank's init failed after its segment was made: peers waiting for
  // it read why there (connect) and stop at once.
  void publishFailure(const std::string& why);
  // Whether p published such a failure: then the error that says so.
  zpResult_t peerFailed(const Peer& p) const;
  Peer* peer(int rank);
  bool drainCtrl(Peer& p);
  bool progressRecv(Peer& p, int lane);
  bool progressSend(Peer& p, int lane);
  // Whether op goes to p by single copy (an offer the receiver reads), else
  // by copy through the ring.
  bool rendezvous(const Peer& p, const Op* op) const;
  // Writes op's next fragment (its meta first, in the first) into the ring;
  // false if there is no room for the `*need` bytes it takes.
  bool writeFragment(Lane& l, Op* op, uint64_t* need);
  // Takes a data fragment of op's (its meta, if any, copied already: the
  // dataLen bytes at data, for op's buffer at `at`) into op's buffer,
  // reducing if op reduces, and frees its record h.
  void takeFragment(Peer& p, Lane& l, Op* op, MsgHdr* h, const char* data, uint32_t dataLen, uint64_t at);
  // moveNow's receive: op's record if it is the whole message op expects
  // (true, op finished); false, touching nothing, for anything else.
  bool takeWhole(Peer& p, Op* op, MsgHdr* h, uint64_t& seq, uint64_t arrivedUs);
  // Sends a control record (makeRecord's fields) to p, behind any that wait
  // for room; true if it is in the ring now.
  bool sendCtrl(Peer& p, uint32_t type, uint64_t seq, int32_t status, uint64_t collSeq, const std::string& text = {},
                uint32_t lane = 0);
  // Writes the control records waiting for room; true if any went.
  bool flushCtrl(Peer& p);
  // A single-copy read of `bytes` from p failed with errno err: why says so;
  // zpRemoteError (and the communicator broken) if p's process is gone,
  // else zpSystemError.
  zpResult_t readFailed(const Peer& p, size_t bytes, int err, std::string* why);
  void peerGone(Peer& p, zpResult_t code, const std::string& why, bool breaksComm, bool fromPeer = false);
  void sendToAll(uint32_t type, zpResult_t code, const std::string& why);
  // Fails and forgets every op queued with one peer.
  void failOps(Peer& p, zpResult_t code, const std::string& why);
  // Rings p's doorbell if it sleeps or waits for room; call after writing.
  // Defined beside its callers (shm_transport.cc): the common case, a peer
  // that neither sleeps nor polls, is a fence and two loads.
  void notify(Peer& p);
  void wakePeer(Peer& p);  // the doorbell, the futex and the bell socket (shm_wait.cc)
  // The bell (shm_wait.cc): a datagram socket with an abstract name, bound
  // at init; bellWorks_ once every local peer is known to reach it.
  void openBell();
  static void bellAddress(const std::string& segName, sockaddr_un* addr, socklen_t* len);
  void connectBells();
  // A record from a peer that this rank has not looked at yet: news for a
  // waiter. Safe without the communicator's lock.
  bool inboundReady() const;

  TransportContext ctx_;
  std::string name_;
  SegHeader* mine_ = nullptr;
  size_t segBytes_ = 0;
  int myLocalIdx_ = -1;
  std::vector<int> local_;  // the ranks of this node
  uint64_t ringBytes_ = 0;
  int fd_ = -1;              // this rank's segment, until every local peer has mapped it
  bool connected_ = false;   // and succeeded
  std::vector<Peer> peers_;
  std::vector<int> peerIndex_;  // by global rank, -1 if not local
  size_t fragMax_ = 0;
  int spinUs_ = 0;      // ZP_SHM_SPIN_US: the poll while every runnable task has a core
  int spinBusyUs_ = 0;  // ZP_SHM_SPIN_BUSY_US: the poll while tasks wait for a core
  int cores_ = 1;       // the cores this node's ranks may run on (coresOfMasks, at connect)
  uint64_t waitMeanUs_ = 0;  // recent waits' running mean (noteWait), microseconds
  int hostRanks_ = 0;        // ZP_HOST_RANKS: the job's ranks on this machine (0: not said)
  // The last two sampleLoads (the last at nowMs `ms`): the machine's
  // runnable tasks and the local peers asleep then (steadierReading).
  mutable struct {
    bool read = false;
    uint64_t ms = 0;
    LoadReading now, last;
  } load_;
  bool oversubscribed_ = false;  // more ranks on this node than cores_
  int bellFd_ = -1;              // this rank's bell: woken through it, and rings peers' with it
  bool bellWorks_ = false;       // every local peer can ring it (same network namespace)
  std::map<const OpReduceGroup*, GroupWait> groups_;
};

}  // namespace zp
