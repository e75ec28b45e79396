// Train an MLP classifier on a three-arm spiral, data-parallel over threads or processes.
//
// Threads (the default): every step, the batch is split into shards; each shard's forward
// and backward pass runs as a task on a thread pool, all against the same parameters. Each
// shard's loss is scaled by its share of the batch, so the gradients the concurrent
// backward passes accumulate into .grad add up to exactly the full-batch gradient.
//
// Processes (--processes P): P rank processes meet through a FileStore, each holds a copy
// of the model (same seed, so the same initial parameters) and trains on its shard; after
// each backward pass one coalesced all_reduce over a process group sums the gradients (--backend
// cpu, the default: shared memory between ranks of one host, c10d::make_process_group; or
// shm, or gloo),
// so every rank takes the same Adam step and the copies stay identical — which the ranks
// check at the end by gathering a checksum of their parameters.
//
// At the end the program reports held-out accuracy, saves the model, loads it into a fresh
// network and checks that both give identical outputs; it exits non-zero when accuracy,
// the round trip or the ranks' agreement falls short. The model is kept at --save PATH;
// without it, the round trip goes through a temporary directory under $TMPDIR (or /tmp)
// that is removed afterwards, so a run leaves nothing in the working directory.
//
// --trace DIR records trace spans (docs/observability.md) into DIR/train-mlp.trace.json
// (threads) or DIR/rank<R>.trace.json (each process): every training step is a span "step"
// (category train, argument step: 1, 2, ...) holding train.forward, train.backward (the
// gradients' all_reduce included, with processes) and train.optimizer.
//
//   gradwire-train-mlp [--steps N] [--shards K | --processes P [--backend cpu|shm|gloo]]
//                      [--save PATH] [--trace DIR]
#include <gradwire/core/trace.h>
#include <gradwire/gradwire.h>

#include "../common/args.h"
#include "../common/spiral.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace gradwire;
using examples::spiral;

namespace {

struct Options {
  int steps = 400;
  int shards = 4;
  int processes = 0;            // 0: threads
  std::string save_path;        // empty: a temporary file, removed after the round trip
  std::string trace;            // --trace DIR: trace files written there
  std::string backend = "cpu";  // --backend: the ranks' process group (with --processes)
};

Options parse_args(int argc, char** argv) {
  Options o;
  examples::Args args(argc, argv,
                      "--steps N, --shards K, --processes P, --backend cpu|shm|gloo, --save PATH, "
                      "--trace DIR");
  while (args.next()) {
    if (args.is("--steps")) {
      o.steps = static_cast<int>(args.integer(1, 1000000));
    } else if (args.is("--shards")) {
      o.shards = static_cast<int>(args.integer(1, 64));
    } else if (args.is("--processes")) {
      o.processes = static_cast<int>(args.integer(1, 16));
    } else if (args.is("--save")) {
      o.save_path = args.value();
    } else if (args.is("--trace")) {
      o.trace = args.non_empty("a directory");
    } else if (args.is("--backend")) {
      o.backend = args.one_of({"cpu", "shm", "gloo"});
    } else {
      args.unknown();
    }
  }
  return o;
}

// A fresh directory under $TMPDIR (or /tmp), named after `what`.
std::string make_temp_dir(const std::string& what) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string where = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  std::string dir_template = where + "/gradwire-train-mlp-" + what + "-XXXXXX";
  if (::mkdtemp(dir_template.data()) == nullptr) {
    throw Error("cannot create a temporary directory in " + where + ": " + std::strerror(errno));
  }
  return dir_template;
}

double accuracy(nn::Module& net, const Tensor& x, const Tensor& y) {
  autograd::NoGradGuard no_grad;
  auto [best, predicted] = max(dynamic_cast<nn::UnaryModule&>(net).forward(x), 1);
  return mean(eq(predicted, y).to(kFloat32)).item<double>();
}

// Saves the model, reloads it into a fresh network and reports whether both agree, and
// whether the held-out accuracy is good enough. Returns the exit code.
int finish(nn::MLP& net, const Tensor& test_x, const Tensor& test_y, const Options& opt,
           double seconds, const std::string& how) {
  const double test_accuracy = accuracy(net, test_x, test_y);
  std::printf("trained %d steps on %s in %.3f s; held-out accuracy %.3f\n", opt.steps, how.c_str(),
              seconds, test_accuracy);
  const bool temporary = opt.save_path.empty();
  const std::string dir = temporary ? make_temp_dir("model") : std::string();
  const std::string path = temporary ? dir + "/spiral_model.gw" : opt.save_path;
  nn::save(net, path);
  Generator other(99);
  nn::MLP reloaded(nn::MLPOptions{.sizes = {2, 64, 64, 3}, .generator = &other});
  nn::load(reloaded, path);
  autograd::NoGradGuard no_grad;
  const bool same = equal(net(test_x), reloaded(test_x));
  std::printf("saved to %s%s and reloaded: outputs %s\n", path.c_str(),
              temporary ? " (temporary; --save PATH keeps it)" : "", same ? "identical" : "DIFFER");
  if (temporary) {
    std::remove(path.c_str());
    ::rmdir(dir.c_str());
  }
  if (!same) return 1;
  if (opt.steps >= 300 && test_accuracy < 0.9) {
    std::fprintf(stderr, "train-mlp: held-out accuracy %.3f is below 0.9\n", test_accuracy);
    return 1;
  }
  return 0;
}

// One rank of the multi-process run.
int train_rank(int rank, const Options& opt, const std::string& store_path) {
  using namespace std::chrono_literals;
  if (!opt.trace.empty()) {
    trace::set_process_name("rank" + std::to_string(rank));
    trace::start(opt.trace);
  }
  auto store = std::make_shared<c10d::FileStore>(
      c10d::FileStoreOptions{.path = store_path, .num_workers = opt.processes, .timeout = 60s});
  auto group = c10d::make_process_group(opt.backend, store, rank, opt.processes,
                                        {.timeout = 60s, .name = "train-mlp"});
  Generator gen(7);
  auto [train_x, train_y] = spiral(300, gen);
  auto [test_x, test_y] = spiral(100, gen);
  nn::MLP net(nn::MLPOptions{.sizes = {2, 64, 64, 3}, .generator = &gen});
  optim::Adam adam(net.parameters(), optim::AdamOptions{.lr = 0.01});
  const Tensor x = chunk(train_x, opt.processes)[static_cast<size_t>(rank)];
  const Tensor y = chunk(train_y, opt.processes)[static_cast<size_t>(rank)];
  const double total = static_cast<double>(train_x.size(0));
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < opt.steps; ++step) {
    const trace::Span step_span("step", "train", trace::Arg("step", step + 1));
    adam.zero_grad();
    Tensor loss;
    {
      const trace::Span phase("train.forward", "train");
      loss = nn::cross_entropy(net(x), y) * (x.size(0) / total);
    }
    Tensor loss_sum;
    {
      const trace::Span phase("train.backward", "train");
      loss.backward();
      std::vector<Tensor> grads;
      for (const Tensor& p : net.parameters())
        grads.push_back(p.grad());
      // The shards' gradients, summed: the full-batch gradient, on every rank.
      loss_sum = loss.detach().reshape({1});
      grads.push_back(loss_sum);
      group->all_reduce(grads).wait();
    }
    {
      const trace::Span phase("train.optimizer", "train");
      adam.step();
    }
    if (rank == 0 && (step % 100 == 0 || step == opt.steps - 1)) {
      std::printf("step %4d  loss %.4f  train accuracy %.3f\n", step, loss_sum.item<float>(),
                  accuracy(net, train_x, train_y));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Every rank must hold the same parameters: gather a checksum from each.
  Tensor checksum = zeros({1}, kFloat64);
  for (const Tensor& p : net.parameters())
    checksum.add_(sum(p.detach().to(kFloat64)).reshape({1}));
  std::vector<Tensor> all;
  for (int r = 0; r < opt.processes; ++r)
    all.push_back(zeros({1}, kFloat64));
  group->all_gather(all, checksum).wait();
  for (int r = 1; r < opt.processes; ++r) {
    if (!equal(all[static_cast<size_t>(r)], all[0])) {
      std::fprintf(stderr, "train-mlp: rank %d's parameters differ from rank 0's\n", r);
      return 1;
    }
  }
  if (rank != 0) return 0;
  std::printf("all %d ranks hold identical parameters (checksum %.6f)\n", opt.processes,
              all[0].item<double>());
  return finish(net, test_x, test_y, opt, seconds,
                std::to_string(opt.processes) + " processes (" +
                    std::string(group->backend_name()) + " all_reduce)");
}

// Forks the ranks (before this process starts any thread) and waits for them.
int run_processes(const Options& opt) {
  // The ranks meet through a FileStore in a fresh directory.
  const std::string dir = make_temp_dir("store");
  const std::string store_path = dir + "/store";
  std::fflush(nullptr);
  std::vector<pid_t> children;
  for (int rank = 0; rank < opt.processes; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(std::string("fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      int code = 2;
      try {
        code = train_rank(rank, opt, store_path);
        // _exit skips the write at exit.
        if (!opt.trace.empty()) trace::flush();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "train-mlp rank %d: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    children.push_back(pid);
  }
  int worst = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 3;
    worst = std::max(worst, code);
  }
  ::rmdir(dir.c_str());
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse_args(argc, argv);
    if (opt.processes > 0) return run_processes(opt);
    if (!opt.trace.empty()) {
      trace::set_process_name("train-mlp");
      trace::start(opt.trace);  // written at exit
    }
    Generator gen(7);
    auto [train_x, train_y] = spiral(300, gen);
    auto [test_x, test_y] = spiral(100, gen);

    nn::MLP net(nn::MLPOptions{.sizes = {2, 64, 64, 3}, .generator = &gen});
    optim::Adam adam(net.parameters(), optim::AdamOptions{.lr = 0.01});
    auto pool = std::make_shared<ThreadPool>(
        ThreadPoolOptions{.num_threads = opt.shards, .name = "train-mlp"});

    const std::vector<Tensor> xs = chunk(train_x, opt.shards), ys = chunk(train_y, opt.shards);
    const double total = static_cast<double>(train_x.size(0));
    const auto start = std::chrono::steady_clock::now();
    for (int step = 0; step < opt.steps; ++step) {
      const trace::Span step_span("step", "train", trace::Arg("step", step + 1));
      adam.zero_grad();
      std::vector<Future<double>> losses;
      for (size_t s = 0; s < xs.size(); ++s) {
        // Each shard's phases on its pool thread.
        losses.push_back(pool->submit([&, s] {
          // mean over the shard x (shard size / batch size) = this shard's part of the mean.
          Tensor loss;
          {
            const trace::Span phase("train.forward", "train", trace::Arg("shard", s));
            loss = nn::cross_entropy(net(xs[s]), ys[s]) * (xs[s].size(0) / total);
          }
          const trace::Span phase("train.backward", "train", trace::Arg("shard", s));
          loss.backward();
          return loss.item<double>();
        }));
      }
      double loss = 0;
      for (double part : collect_all(losses).get(std::chrono::seconds(60)))
        loss += part;
      {
        const trace::Span phase("train.optimizer", "train");
        adam.step();
      }
      if (step % 100 == 0 || step == opt.steps - 1) {
        std::printf("step %4d  loss %.4f  train accuracy %.3f\n", step, loss,
                    accuracy(net, train_x, train_y));
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return finish(net, test_x, test_y, opt, seconds,
                  std::to_string(opt.shards) + " shards (threads)");
  } catch (const Error& e) {
    std::fprintf(stderr, "train-mlp: %s\n", e.what());
    return 2;
  }
}
