// Sparse-rows tensors on the rpc wire: they travel as a SparseRowsValue naming two of the
// message's tensors (row numbers and stored rows) and the dense shape, so only the stored
// rows travel; in arguments, results, lists and maps; in Protobuf's own bytes. Hostile
// sparse values (a row out of range, rows of the wrong shape, a missing part, a huge or
// deep shape, parts that require grad) are refused as malformed envelopes naming what was
// wrong, and a worker that receives one serves on.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include <tensorpipe/tensorpipe.h>

#include "agent_fixture.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/error.h"
#include "gradwire/rpc/envelope.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/sparse.h"
#include "proto/envelope.pb.h"
#include "support/sync.h"
#include "transport/stream_transport.h"
#include "wire.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace agent_fixture;

// What a transport does: allocate each announced tensor, copy the data in, decode.
Envelope transport(const EncodedMessage& m, const EnvelopeLimits& limits = {}) {
  std::vector<Tensor> received;
  for (const IncomingTensor& t : peek_tensors(m.payload, limits))
    received.push_back(empty(t.sizes, t.dtype));
  for (size_t i = 0; i < received.size(); ++i)
    received[i].copy_(m.tensors[i]);
  return decode(m.payload, received, limits);
}

std::string refusal(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

// A [rows, 3] float64 sparse tensor holding `indices` (row k of the values is k+1, k+1.5, k+2).
Tensor sparse_of(const std::vector<int64_t>& indices, int64_t rows) {
  std::vector<double> v;
  for (size_t k = 0; k < indices.size(); ++k) {
    const double b = static_cast<double>(k) + 1;
    v.insert(v.end(), {b, b + 0.5, b + 1});
  }
  return sparse_rows(tensor<int64_t>(indices),
                     tensor(v, Shape{static_cast<int64_t>(indices.size()), 3}), {rows, 3});
}

// The same layout, shape, rows and values (exactly).
void expect_same_sparse(const Tensor& got, const Tensor& want) {
  ASSERT_TRUE(got.defined());
  ASSERT_TRUE(got.is_sparse()) << "arrived " << layout_name(got.layout());
  EXPECT_EQ(got.sizes(), want.sizes());
  EXPECT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.indices().to_vector<int64_t>(), want.indices().to_vector<int64_t>());
  EXPECT_EQ(got.values().sizes(), want.values().sizes());
  EXPECT_EQ(got.values().contiguous().to_vector<double>(),
            want.values().contiguous().to_vector<double>());
}

std::string reserialized(const std::string& payload) {
  wire::Envelope env;
  EXPECT_TRUE(env.ParseFromString(payload));
  return env.SerializeAsString();
}

TEST(SparseWire, RoundTripsInArgumentsResultsListsAndMaps) {
  const Tensor a = sparse_of({3, 0, 3}, 10);  // row 3 twice: duplicates travel as they are
  const Tensor b = sparse_of({7}, 8);
  const Tensor empty_rows = sparse_rows_zeros({5, 3}, kFloat64);
  const Tensor dense = arange(Scalar(4), kFloat64);
  Request req;
  req.id = 5;
  req.function = "f";
  req.args = {Value(a), Value::list({Value(dense), Value(b), Value(empty_rows)}),
              Value::map({{Value("grad"), Value(a)}, {Value(int64_t{2}), Value(dense)}})};
  for (const size_t inline_bytes : {size_t{0}, kDefaultInlineTensorBytes}) {
    const Request back =
        std::get<Request>(transport(encode(Envelope{req}, nullptr, inline_bytes)).body);
    ASSERT_EQ(back.args.size(), 3u);
    expect_same_sparse(back.args[0].as_tensor(), a);
    const Value::List& list = back.args[1].as_list();
    EXPECT_FALSE(list[0].as_tensor().is_sparse());
    EXPECT_EQ(list[0].as_tensor().to_vector<double>(), dense.to_vector<double>());
    expect_same_sparse(list[1].as_tensor(), b);
    expect_same_sparse(list[2].as_tensor(), empty_rows);
    EXPECT_EQ(list[2].as_tensor().nnz(), 0);
    const Value::Map& map = back.args[2].as_map();
    expect_same_sparse(map[0].second.as_tensor(), a);
    EXPECT_EQ(map[1].second.as_tensor().to_vector<double>(), dense.to_vector<double>());
    EXPECT_EQ(back.args[0].describe(), "Tensor sparse_rows float64[10, 3] (3 rows stored)");
  }
  Response resp;
  resp.id = 5;
  resp.result = Value::list({Value(b), Value(a)});
  const Response got = std::get<Response>(transport(encode(Envelope{resp})).body);
  const Value::List& items = std::get<Value>(got.result).as_list();
  expect_same_sparse(items[0].as_tensor(), b);
  expect_same_sparse(items[1].as_tensor(), a);
}

TEST(SparseWire, OnlyTheStoredRowsTravel) {
  // A table of a million rows of 8 float32 (32 MB dense) with 3 rows stored.
  const Tensor g = sparse_rows(tensor<int64_t>({999'999, 4, 17}), ones({3, 8}), {1'000'000, 8});
  Request req;
  req.function = "step";
  req.args = {Value(g)};
  const EncodedMessage m = encode(Envelope{req}, nullptr, /*inline_tensor_bytes=*/0);
  ASSERT_EQ(m.tensors.size(), 2u);  // row numbers, then rows
  EXPECT_EQ(m.tensors[0].nbytes(), 3u * sizeof(int64_t));
  EXPECT_EQ(m.tensors[1].nbytes(), 3u * 8u * sizeof(float));
  EXPECT_LT(m.payload.size(), 200u);
  wire::Envelope env;
  ASSERT_TRUE(env.ParseFromString(m.payload));
  const wire::Value& v = env.request().args(0);
  ASSERT_TRUE(v.has_sparse_rows());
  EXPECT_EQ(v.sparse_rows().indices_index(), 0u);
  EXPECT_EQ(v.sparse_rows().values_index(), 1u);
  ASSERT_EQ(v.sparse_rows().sizes_size(), 2);
  EXPECT_EQ(v.sparse_rows().sizes(0), 1'000'000);
  EXPECT_EQ(v.sparse_rows().sizes(1), 8);
  // What arrives stands for the same dense tensor, rows included.
  const Tensor back = std::get<Request>(transport(m).body).args[0].as_tensor();
  ASSERT_TRUE(back.is_sparse());
  EXPECT_EQ(back.sizes(), (Shape{1'000'000, 8}));
  EXPECT_EQ(back.indices().to_vector<int64_t>(), (std::vector<int64_t>{999'999, 4, 17}));
  EXPECT_EQ(sum(back.values()).item<float>(), 24.0f);
}

TEST(SparseWire, EncodingIsProtobufsOwnBytes) {
  std::mt19937 rng(20261207);
  for (int i = 0; i < 200; ++i) {
    Request req;
    req.id = static_cast<uint64_t>(i);
    req.function = "f";
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int a = 0; a < n; ++a) {
      const int64_t rows = 1 + static_cast<int64_t>(rng() % 300);
      std::vector<int64_t> idx;
      for (size_t k = rng() % 5; k > 0; --k)
        idx.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(rows)));
      Tensor s = sparse_of(idx, rows);
      switch (rng() % 3) {
        case 0:
          req.args.emplace_back(s);
          break;
        case 1:
          req.args.push_back(Value::list({Value(ones({2})), Value(s)}));
          break;
        default:
          req.args.push_back(Value::map({{Value(int64_t{a}), Value(s)}}));
          break;
      }
    }
    for (const size_t inline_bytes : {size_t{0}, kDefaultInlineTensorBytes}) {
      const EncodedMessage m = encode(Envelope{req}, nullptr, inline_bytes);
      ASSERT_EQ(m.payload, reserialized(m.payload)) << "request " << i;
    }
    Response resp;
    resp.id = req.id;
    resp.result = req.args.back();
    const EncodedMessage r = encode(Envelope{resp});
    ASSERT_EQ(r.payload, reserialized(r.payload)) << "response " << i;
  }
}

// A request carrying sparse_of({1, 3}, 4) inline, its envelope edited by `edit` (as a hostile
// peer would write it): the refusal's text.
std::string refusal_of_edited(const std::function<void(wire::Envelope&)>& edit) {
  Request req;
  req.id = 9;
  req.function = "f";
  req.args = {Value(sparse_of({1, 3}, 4))};
  const EncodedMessage m = encode(Envelope{req});
  EXPECT_TRUE(m.tensors.empty());
  wire::Envelope env;
  EXPECT_TRUE(env.ParseFromString(m.payload));
  edit(env);
  const std::string payload = env.SerializeAsString();
  return refusal([&] { decode(payload, {}); });
}

wire::SparseRowsValue& sparse_arg(wire::Envelope& env) {
  return *env.mutable_request()->mutable_args(0)->mutable_sparse_rows();
}

TEST(SparseWire, MalformedSparseValuesAreRefusedNamingWhatIsWrong) {
  const auto expect_refused = [](const std::function<void(wire::Envelope&)>& edit,
                                 const std::string& names) {
    const std::string text = refusal_of_edited(edit);
    EXPECT_NE(text.find("malformed rpc envelope: "), std::string::npos) << text;
    EXPECT_NE(text.find(names), std::string::npos) << text;
  };
  // Untouched, it is accepted.
  EXPECT_EQ(refusal_of_edited([](wire::Envelope&) {}), "(no InvalidArgument)");
  // A row number past the dense shape's rows (row 3 of 2).
  expect_refused([](wire::Envelope& e) { sparse_arg(e).set_sizes(0, 2); },
                 "row index 3 (entry 1) is out of range for 2 rows");
  // Rows whose shape does not fit the dense shape.
  expect_refused([](wire::Envelope& e) { sparse_arg(e).set_sizes(1, 5); },
                 "values of shape [2, 3] do not fit 2 rows of a tensor of shape [4, 5]");
  // A part that is not in the message.
  expect_refused([](wire::Envelope& e) { sparse_arg(e).set_values_index(7); },
                 "a sparse tensor's rows name tensor 7, out of range (the message has 2 tensors)");
  expect_refused([](wire::Envelope& e) { sparse_arg(e).set_indices_index(2); },
                 "row numbers name tensor 2, out of range");
  // The rows as row numbers: not integers.
  expect_refused([](wire::Envelope& e) { sparse_arg(e).set_indices_index(1); },
                 "indices must be 1-d");
  // The row numbers as rows: not floating point.
  expect_refused(
      [](wire::Envelope& e) {
        sparse_arg(e).set_values_index(0);
        sparse_arg(e).clear_sizes();
        sparse_arg(e).add_sizes(4);
      },
      "values must be floating point");
  // Huge, negative, missing and too deep dense shapes.
  expect_refused(
      [](wire::Envelope& e) {
        sparse_arg(e).set_sizes(0, int64_t{1} << 40);
        sparse_arg(e).set_sizes(1, int64_t{1} << 40);
      },
      "is too large");
  expect_refused([](wire::Envelope& e) { sparse_arg(e).set_sizes(0, -4); }, "a negative size -4");
  expect_refused([](wire::Envelope& e) { sparse_arg(e).clear_sizes(); },
                 "a sparse tensor without a dense shape");
  expect_refused(
      [](wire::Envelope& e) {
        for (int k = 0; k < 70; ++k)
          sparse_arg(e).add_sizes(1);
      },
      "a sparse tensor's dense shape has more than 64 dims (max_tensor_dims)");
  // Parts that claim to require grad: a sparse tensor never does.
  expect_refused([](wire::Envelope& e) { e.mutable_tensors(1)->set_requires_grad(true); },
                 "a sparse tensor's rows (tensor 1) require grad; sparse tensors never do");
}

// A worker that predates a Value kind (as one before SparseRowsValue) finds no kind set in
// it: the message is refused, never misread as another kind.
TEST(SparseWire, AValueOfAKindThisWorkerDoesNotKnowIsRefused) {
  const std::string text = refusal_of_edited([](wire::Envelope& e) {
    wire::Value* v = e.mutable_request()->mutable_args(0);
    v->clear_kind();
    // Field 12 of Value, a length-delimited kind no worker knows yet, as unknown bytes.
    wire::Value carrier;
    carrier.set_bytes_value("xyz");
    std::string bytes = carrier.SerializeAsString();
    bytes[0] = static_cast<char>(12 << 3 | 2);
    EXPECT_TRUE(v->ParseFromString(bytes));
  });
  EXPECT_NE(text.find("malformed rpc envelope: a value of no known kind"), std::string::npos)
      << text;
}

// The address a worker published, read back from the store.
std::string published_url(c10d::Store& store, int rank) {
  std::istringstream in(c10d::to_string(store.get("rpc/1/worker/" + std::to_string(rank))));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("url ", 0) == 0) return line.substr(4);
  }
  return "";
}

TEST(SparseWire, AgentsCarrySparseTensorsAndRefuseMalformedOnesServingOn) {
  Registry reg;
  register_basics(reg);
  reg.def("rows_twice", [](const Tensor& g) {
    // sparse + sparse stays sparse: the rows concatenated.
    return std::vector<Tensor>{add(g, g), g.to_dense()};
  });
  auto store = std::make_shared<c10d::HashStore>(20s);
  Agents agents = start_agents(2, test_options(reg), store);
  const Tensor g = sparse_of({2, 5, 2}, 6);
  // In arguments and results, small (inline) and large (beside the envelope).
  const Tensor large = sparse_rows(tensor<int64_t>({1, 0}), ones({2, 5000}, kFloat64), {3, 5000});
  for (const Tensor& t : {g, large}) {
    expect_same_sparse(agents[1]->rpc_sync<Tensor>(worker_name(0), "echo", t), t);
    const auto both = agents[1]->rpc_sync<std::vector<Tensor>>(worker_name(0), "rows_twice", t);
    ASSERT_EQ(both.size(), 2u);
    ASSERT_TRUE(both[0].is_sparse());
    EXPECT_EQ(both[0].nnz(), 2 * t.nnz());
    EXPECT_FALSE(both[1].is_sparse());
    EXPECT_EQ(both[1].to_vector<double>(), t.to_dense().to_vector<double>());
  }

  // A raw peer's request whose sparse value names a row past its shape.
  const std::string url = published_url(*store, 0);
  ASSERT_FALSE(url.empty());
  namespace tp = tensorpipe;
  auto context = std::make_shared<tp::Context>(tp::ContextOptions().name("intruder"));
  context->registerTransport(0, "tcp", transport::create_stream_context({}));
  context->registerChannel(0, "basic", tp::channel::basic::create());
  auto pipe = context->connect(url);
  Request req;
  req.id = 77;
  req.function = "echo";
  req.args = {Value(g)};
  wire::Envelope env;
  ASSERT_TRUE(env.ParseFromString(encode(Envelope{req}).payload));
  sparse_arg(env).set_sizes(0, 2);  // rows 2 and 5 of 2
  tp::Message message;
  message.metadata = env.SerializeAsString();
  test::CountdownLatch done(1);
  std::string reply_payload;
  std::string read_error;
  pipe->write(std::move(message), [](const tp::Error&) {});
  pipe->readDescriptor([&](const tp::Error& error, tp::Descriptor descriptor) {
    if (error) {
      read_error = error.what();
      done.count_down();
      return;
    }
    reply_payload = descriptor.metadata;
    pipe->read(tp::Allocation{}, [&](const tp::Error&) { done.count_down(); });
  });
  ASSERT_TRUE(done.wait(10s));
  ASSERT_EQ(read_error, "");
  const Response response = std::get<Response>(decode(reply_payload, {}).body);
  EXPECT_EQ(response.id, 77u);
  const ErrorReply& err = std::get<ErrorReply>(response.result);
  EXPECT_EQ(err.kind, ErrorKind::kInvalidArgument);
  EXPECT_TRUE(err.rejected);
  EXPECT_NE(err.message.find("malformed rpc envelope: a sparse tensor does not fit its parts"),
            std::string::npos)
      << err.message;
  EXPECT_NE(err.message.find("row index 2 (entry 0) is out of range for 2 rows"), std::string::npos)
      << err.message;
  pipe->close();
  context->join();

  // The worker serves on, sparse tensors included.
  test::expect_every_pair_answers(agents);
  expect_same_sparse(agents[1]->rpc_sync<Tensor>(worker_name(0), "echo", g), g);
  expect_clean_shutdown(agents);
}

}  // namespace
}  // namespace gradwire::rpc
