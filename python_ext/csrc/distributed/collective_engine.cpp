// The launcher and completer threads of one npu process group
// (collective_engine.h).
#include "distributed/collective_engine.h"

#include <c10/util/Exception.h>

#include <npubridge/support/env.h>

#include "runtime/npu_runtime.h"

#include <Python.h>

#include <algorithm>
#include <utility>

namespace npub::dist {

namespace {

// NPUB_DIST_CHECK=0 turns the signature check off (fingerprint.h); read
// strictly (Note [A setting is read strictly or refused],
// support/include/npubridge/support/env.h) when a group is made.
bool check_enabled() { return env::get_flag("NPUB_DIST_CHECK", true); }

std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(std::move(e));
  } catch (const c10::Error& err) {
    return err.what_without_backtrace();
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

CollectiveEngine::CollectiveEngine(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size,
                                   std::chrono::milliseconds timeout)
    : gloo_(std::move(gloo)), rank_(rank), size_(size), check_(check_enabled()), timeout_(timeout) {
  launcher_ = std::thread([this] { run_launcher(); });
  completer_ = std::thread([this] { run_completer(); });
}

// Note [The engine's threads are joined without the GIL]
// The group usually goes when Python drops its last reference (the end of
// the function that held the DDP module or the group, a gc pass), so this
// destructor runs holding the GIL. The threads it joins may need the GIL to
// finish: with torch's PyObject preservation, dropping a reference to a
// tensor that has a Python object (the caller's tensors, which a Job keeps
// alive and a WorkNPU holds as its result) decrefs that object when the
// C++ count falls to one, under the GIL; a Python then() callback runs
// under it. A callback thread may still be releasing the Work of the last
// collective when the caller, already past that Work's wait(), destroys the
// group (the Work completes before its future settles: Note [Future
// callbacks never run on the completer]). Joined with the GIL held, it
// waits for the GIL forever: the hang at the exit of a DDP script. So the
// joins run with the GIL released. Not during finalisation: torch's decref
// leaks then instead of taking the GIL, and a thread that takes the GIL
// then is ended by Python.
namespace {

class GilReleasedIfHeld {
 public:
  GilReleasedIfHeld() {
    if (Py_IsInitialized() && !_Py_IsFinalizing() && PyGILState_Check()) saved_ = PyEval_SaveThread();
  }
  ~GilReleasedIfHeld() {
    if (saved_ != nullptr) PyEval_RestoreThread(saved_);
  }
  GilReleasedIfHeld(const GilReleasedIfHeld&) = delete;
  GilReleasedIfHeld& operator=(const GilReleasedIfHeld&) = delete;

 private:
  PyThreadState* saved_ = nullptr;
};

}  // namespace

CollectiveEngine::~CollectiveEngine() {
  GilReleasedIfHeld nogil;  // Note [The engine's threads are joined without the GIL]
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  launch_cv_.notify_all();
  launcher_.join();
  completer_.join();
  {
    std::lock_guard<std::mutex> lock(cb_mu_);
    callbacks_stopping_ = true;
  }
  cb_cv_.notify_all();
  for (auto& t : callback_threads_) t.join();
}

// Note [Future callbacks never run on the completer]
// c10's Future runs then() and done callbacks inline in markCompleted. A
// callback may wait for a later collective of the group (DDP's PowerSGD
// hook waits an all_reduce's future inside a then(); a synchronous
// all_reduce in a callback waits its Work): were it run on the completer,
// the only thread that finishes that collective would be the one waiting.
// So the completer completes the Work only (wait() and isCompleted() look at
// nothing else) and queues its future here. Futures complete in the
// completer's order: the callback thread that takes future k completes it
// once future k-1 completed (its first callback, registered by WorkNPU,
// signals that before any user callback runs). A callback that blocks keeps
// its thread; the next future then gets a new thread, so a callback waiting
// for a later future of the group is never waiting for itself.
void CollectiveEngine::settle_later(const c10::intrusive_ptr<WorkNPU>& work, int device,
                                    sim::Stream* stream) {
  bool spawn = false;
  {
    std::lock_guard<std::mutex> lock(cb_mu_);
    const uint64_t ticket = next_ticket_++;
    work->set_settle_started([this, ticket] {
      {
        std::lock_guard<std::mutex> l(cb_mu_);
        started_ = std::max(started_, ticket + 1);
      }
      cb_cv_.notify_all();
    });
    settles_.push_back(Settle{work, device, stream, ticket});
    spawn = idle_callback_threads_ == 0;
    if (spawn) {
      ++idle_callback_threads_;  // counted from now: a burst spawns one
      callback_threads_.emplace_back([this] { run_callbacks(); });
    }
  }
  if (!spawn) cb_cv_.notify_all();
}

void CollectiveEngine::run_callbacks() {
  std::unique_lock<std::mutex> lock(cb_mu_);
  for (;;) {  // idle (counted in idle_callback_threads_) at the top
    cb_cv_.wait(lock, [&] { return callbacks_stopping_ || !settles_.empty(); });
    if (settles_.empty()) return;
    --idle_callback_threads_;
    Settle item = std::move(settles_.front());
    settles_.pop_front();
    cb_cv_.wait(lock, [&] { return started_ >= item.ticket; });
    lock.unlock();
    if (item.stream != nullptr) {
      // The future records its event on this thread's current stream
      // (Note [The future of an npu collective carries its device]).
      torch_backend::rt().devices().set_current_device(item.device);
      torch_backend::rt().devices().at(item.device).set_current_stream(*item.stream);
    }
    item.work->settle_future();
    item.work.reset();  // may be the last reference: outside the lock
    lock.lock();
    ++idle_callback_threads_;
  }
}

void CollectiveEngine::submit(std::unique_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) {
      C10_THROW_ERROR(DistBackendError,
                      c10::str("npu backend: ", job->what,
                               ": the process group is unusable after an earlier failure: ", broken_));
    }
    pending_.push_back(std::shared_ptr<Job>(std::move(job)));
  }
  launch_cv_.notify_one();
}

sim::Stream& CollectiveEngine::stream(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(device);
  if (it != streams_.end()) return *it->second;
  // A stream of its own, not one of the device's pool, which user streams
  // share: the launcher synchronises it after every staging copy.
  sim::Stream* s = &torch_backend::rt().devices().at(device).create_stream();
  streams_.emplace(device, s);
  return *s;
}

void CollectiveEngine::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  timeout_ = timeout;
}

std::chrono::milliseconds CollectiveEngine::timeout() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timeout_;
}

std::string CollectiveEngine::broken_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

std::exception_ptr CollectiveEngine::transport_error(const Job& job, const char* stage,
                                                     std::exception_ptr cause) {
  std::string why = what_of(std::move(cause));
  // gloo says "Operation timed out!", and nothing of whom it waited for.
  if (why.find("timed out") != std::string::npos || why.find("Timed out") != std::string::npos)
    why = c10::str("no answer within the group's timeout of ", timeout().count(), " ms (", why, ")");
  const std::string msg = c10::str("npu backend: ", job.what, " failed ", stage, " on rank ", rank_, " of ",
                                   size_, " (peer ", job.peers, "): ", why);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty()) broken_ = msg;
  }
  try {
    C10_THROW_ERROR(DistBackendError, msg);
  } catch (...) {
    return std::current_exception();
  }
}

// Note [A collective reads after the previous ones wrote]
// Collectives are staged in issue order but complete later, so a collective
// whose input overlaps the output of one still in flight (two all_reduce
// calls on one tensor with async_op=True, as NCCL allows on its single
// stream) would copy the input to the host before the first result landed.
// The launcher waits for such writers first. Overlap is by bytes
// (memory_span), so collectives on other tensors or on disjoint views of
// one buffer (DDP's buckets, FSDP's shards) keep overlapping.
void CollectiveEngine::wait_for_writers(const Job& job) {
  std::unique_lock<std::mutex> lock(mu_);
  writers_cv_.wait(lock, [&] {
    for (const MemSpan& r : job.reads)
      for (const MemSpan& w : in_flight_writes_)
        if (r.overlaps(w)) return false;
    return true;
  });
}

void CollectiveEngine::run_launcher() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      launch_cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) break;
      job = std::move(pending_.front());
      pending_.pop_front();
    }
    launch(job);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    launcher_done_ = true;
  }
  complete_cv_.notify_all();
}

void CollectiveEngine::launch(const std::shared_ptr<Job>& job) {
  auto hand_over = [&](Launched item) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      launched_.push_back(std::move(item));
    }
    complete_cv_.notify_one();
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) {
      std::exception_ptr e;
      try {
        C10_THROW_ERROR(DistBackendError,
                        c10::str("npu backend: ", job->what,
                                 ": the process group is unusable after an earlier failure: ", broken_));
      } catch (...) {
        e = std::current_exception();
      }
      launched_.push_back(Launched{job, 0, {}, e});
      complete_cv_.notify_one();
      return;
    }
  }
  const char* stage = "checking the ranks' signatures";
  size_t i = 0;
  try {
    sim::Stream* s = job->device >= 0 ? &stream(job->device) : nullptr;
    if (s != nullptr) s->wait_event(job->ready);
    std::optional<SignatureCheck> check;
    if (check_ && job->signature) check.emplace(*gloo_, *job->signature, rank_, size_);
    wait_for_writers(*job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_writes_.insert(in_flight_writes_.end(), job->writes.begin(), job->writes.end());
      job->writes_registered = true;
    }
    for (; i < job->steps.size(); ++i) {
      Step& step = job->steps[i];
      if (step.to_host) {
        stage = "copying to the host";
        step.to_host(*s);
        s->synchronize();
      }
      if (check) {
        // After the first staging copies, which overlapped the exchange.
        stage = "checking the ranks' signatures";
        const std::string mismatch = check->verdict(timeout());
        check.reset();
        if (!mismatch.empty()) {
          // Every rank sees the same gathered signatures and fails this
          // collective alike before any data moved: the group stays usable.
          std::exception_ptr e;
          try {
            TORCH_CHECK(false, mismatch);
          } catch (...) {
            e = std::current_exception();
          }
          hand_over(Launched{job, 0, {}, e});
          return;
        }
      }
      stage = "starting gloo";
      GlooWorks works = step.launch ? step.launch() : GlooWorks{};
      hand_over(Launched{job, i, std::move(works), nullptr});
    }
  } catch (...) {
    hand_over(Launched{job, i, {}, transport_error(*job, stage, std::current_exception())});
  }
}

void CollectiveEngine::run_completer() {
  for (;;) {
    Launched item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      complete_cv_.wait(lock, [&] { return !launched_.empty() || launcher_done_; });
      if (launched_.empty()) break;
      item = std::move(launched_.front());
      launched_.pop_front();
    }
    const std::shared_ptr<Job>& job = item.job;
    if (job->failed) continue;  // an earlier step of it failed
    if (item.error) {
      finish(job, item.error);
      continue;
    }
    const char* stage = "in gloo";
    try {
      const std::chrono::milliseconds limit = timeout();
      for (auto& w : item.works) w->wait(limit);
      sim::Stream* s = job->device >= 0 ? &stream(job->device) : nullptr;
      Step& step = job->steps[item.step];
      if (step.to_device) {
        stage = "copying back to the device";
        step.to_device(*s);
      }
      if (item.step + 1 == job->steps.size()) {
        stage = "copying back to the device";
        int source = -1;
        if (job->source_rank) source = job->source_rank(item.works);
        if (s != nullptr) s->synchronize();
        if (std::exception_ptr e = job->work->first_member_error()) {
          // endCoalescing's Work: its members completed before it (FIFO);
          // its future must carry their failure, not succeed.
          finish(job, e);
          continue;
        }
        job->work->complete(s, source);
        finish(job, nullptr);
        settle_later(job->work, job->device, s);
      }
    } catch (...) {
      finish(job, transport_error(*job, stage, std::current_exception()));
    }
  }
}

void CollectiveEngine::finish(const std::shared_ptr<Job>& job, std::exception_ptr error) {
  if (job->writes_registered) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const MemSpan& w : job->writes)
        in_flight_writes_.erase(std::find(in_flight_writes_.begin(), in_flight_writes_.end(), w));
    }
    job->writes_registered = false;
    writers_cv_.notify_all();
  }
  if (error) {
    job->failed = true;
    // The copies back of earlier chunks may still be queued on the
    // collective stream, reading staging and device memory that the job
    // keeps alive: let them run before the job can go.
    if (job->device >= 0) {
      try {
        stream(job->device).synchronize();
      } catch (...) {  // a device error is reported by the device; the job fails anyway
      }
    }
    // gloo may still hold the buffers of a collective that failed.
    for (auto& lease : job->staging) lease.discard();
    job->work->fail(std::move(error));
    sim::Stream* s = job->device >= 0 ? &stream(job->device) : nullptr;
    settle_later(job->work, job->device, s);
  }
}

}  // namespace npub::dist
