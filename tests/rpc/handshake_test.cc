// gradwire's transport handshake on its own (Handshake): hellos, the shared secret's proof
// on both ends, the claimed identity inside the proof, and refusals that name their cause.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

#include "transport/handshake.h"

namespace gradwire::rpc {
namespace {

using transport::Handshake;

// Passes bytes between two handshakes until neither has anything to say.
void exchange(Handshake& client, Handshake& server, bool byte_by_byte = false) {
  for (int round = 0; round < 8; ++round) {
    bool moved = false;
    for (auto [from, to] : {std::pair{&client, &server}, std::pair{&server, &client}}) {
      const std::string out = from->take_output();
      if (out.empty() || to->state() != Handshake::State::kRunning) continue;
      moved = true;
      if (byte_by_byte) {
        for (char c : out)
          to->feed(reinterpret_cast<const uint8_t*>(&c), 1);
      } else {
        EXPECT_EQ(to->feed(reinterpret_cast<const uint8_t*>(out.data()), out.size()), out.size());
      }
    }
    if (!moved) return;
  }
}

TEST(Handshake, WithoutASecretTwoHellosOpenTheConnection) {
  Handshake client(Handshake::Role::kClient, "");
  Handshake server(Handshake::Role::kServer, "");
  exchange(client, server);
  EXPECT_EQ(client.state(), Handshake::State::kDone);
  EXPECT_EQ(server.state(), Handshake::State::kDone);
  EXPECT_FALSE(client.authenticated());
  // Bytes after the peer's hello belong to the stream: they are not consumed.
  Handshake c2(Handshake::Role::kClient, "", {"w3", 3, 2});
  Handshake s2(Handshake::Role::kServer, "");
  std::string hello = c2.take_output();
  const size_t hello_bytes = transport::kHelloBytes + transport::kIdentityHeaderBytes + 2;
  ASSERT_EQ(hello.size(), hello_bytes);
  hello += "frame";
  EXPECT_EQ(s2.feed(reinterpret_cast<const uint8_t*>(hello.data()), hello.size()), hello_bytes);
  EXPECT_EQ(s2.state(), Handshake::State::kDone);
  // The server knows whom the client claims to be, but nothing proves it.
  EXPECT_EQ(s2.peer().name, "w3");
  EXPECT_EQ(s2.peer().rank, 3);
  EXPECT_EQ(s2.peer().incarnation, 2);
  EXPECT_FALSE(s2.authenticated());
}

TEST(Handshake, TheSameSecretAuthenticatesBothEndsEvenByteByByte) {
  Handshake client(Handshake::Role::kClient, "correct horse battery", {"w1", 1, 0});
  Handshake server(Handshake::Role::kServer, "correct horse battery");
  exchange(client, server, /*byte_by_byte=*/true);
  EXPECT_EQ(client.state(), Handshake::State::kDone) << client.error();
  EXPECT_EQ(server.state(), Handshake::State::kDone) << server.error();
  EXPECT_TRUE(client.authenticated());
  EXPECT_TRUE(server.authenticated());
  EXPECT_EQ(server.peer().name, "w1");
  EXPECT_EQ(server.peer().rank, 1);
}

TEST(Handshake, AWrongSecretFailsOnBothEndsWithoutNamingItAndTheServerNeverProves) {
  // The client proves first: the server refuses it, and the client learns so from the
  // verdict byte, never from a proof of the server's.
  Handshake client(Handshake::Role::kClient, "alpha alpha alpha");
  Handshake server(Handshake::Role::kServer, "bravo bravo bravo");
  std::string to_client;
  for (int round = 0; round < 4; ++round) {
    const std::string out = client.take_output();
    server.feed(reinterpret_cast<const uint8_t*>(out.data()), out.size());
    const std::string back = server.take_output();
    to_client += back;
    client.feed(reinterpret_cast<const uint8_t*>(back.data()), back.size());
  }
  EXPECT_EQ(server.state(), Handshake::State::kFailed);
  EXPECT_NE(server.error().find("does not know this job's secret"), std::string::npos);
  EXPECT_EQ(client.state(), Handshake::State::kFailed);
  EXPECT_NE(client.error().find("the peer refused this worker's secret"), std::string::npos)
      << client.error();
  // Its hello and a refusal: nothing computed from the secret.
  EXPECT_EQ(to_client.size(), transport::kHelloBytes + 1);
  EXPECT_EQ(to_client.back(), '\0');
  for (const std::string* e : {&client.error(), &server.error()}) {
    EXPECT_EQ(e->find("alpha"), std::string::npos);
    EXPECT_EQ(e->find("bravo"), std::string::npos);
  }
  // A forged proof is refused the same way.
  Handshake server2(Handshake::Role::kServer, "bravo bravo bravo");
  Handshake honest(Handshake::Role::kClient, "bravo bravo bravo");
  std::string hello = honest.take_output();
  server2.feed(reinterpret_cast<const uint8_t*>(hello.data()), hello.size());
  EXPECT_EQ(server2.take_output().size(), transport::kHelloBytes);
  const std::string forged(transport::kMacBytes, '\x5a');
  server2.feed(reinterpret_cast<const uint8_t*>(forged.data()), forged.size());
  EXPECT_EQ(server2.state(), Handshake::State::kFailed);
  EXPECT_EQ(server2.take_output(), std::string(1, '\0'));
  EXPECT_NE(server2.error().find("does not know this job's secret"), std::string::npos);
}

TEST(Handshake, TheClaimedIdentityVersionAndFlagsAreInsideTheProof) {
  // A man in the middle who rewrites any byte of the client's hello (here: its rank, then
  // its name) makes the client's proof fail at the server.
  for (const size_t at : {transport::kHelloBytes, transport::kHelloBytes + 10}) {
    Handshake client(Handshake::Role::kClient, "a secret of the job", {"w1", 1, 0});
    Handshake server(Handshake::Role::kServer, "a secret of the job");
    std::string hello = client.take_output();
    ASSERT_LT(at, hello.size());
    hello[at] = static_cast<char>(hello[at] ^ 1);
    server.feed(reinterpret_cast<const uint8_t*>(hello.data()), hello.size());
    const std::string back = server.take_output();
    client.feed(reinterpret_cast<const uint8_t*>(back.data()), back.size());
    const std::string proof = client.take_output();
    ASSERT_EQ(proof.size(), transport::kMacBytes);
    server.feed(reinterpret_cast<const uint8_t*>(proof.data()), proof.size());
    EXPECT_EQ(server.state(), Handshake::State::kFailed) << "byte " << at;
    EXPECT_EQ(server.take_output(), std::string(1, '\0'));
  }
}

TEST(Handshake, ASecretOnOneSideOnlySaysWhichSideLacksIt) {
  {
    Handshake client(Handshake::Role::kClient, "");
    Handshake server(Handshake::Role::kServer, "a secret of the job");
    exchange(client, server);
    EXPECT_EQ(server.state(), Handshake::State::kFailed);
    EXPECT_EQ(client.state(), Handshake::State::kFailed);
    EXPECT_NE(client.error().find("requires a shared secret and none is set here"),
              std::string::npos)
        << client.error();
    EXPECT_NE(client.error().find("GRADWIRE_SECRET"), std::string::npos);
    EXPECT_NE(server.error().find("the peer has no secret set"), std::string::npos);
  }
  {
    Handshake client(Handshake::Role::kClient, "a secret of the job");
    Handshake server(Handshake::Role::kServer, "");
    exchange(client, server);
    EXPECT_EQ(server.state(), Handshake::State::kFailed);
    EXPECT_EQ(client.state(), Handshake::State::kFailed);
    EXPECT_NE(client.error().find("the peer has no secret set"), std::string::npos);
    EXPECT_NE(server.error().find("this worker has none set"), std::string::npos);
  }
}

TEST(Handshake, GarbageAndOtherVersionsAreRefusedByName) {
  Handshake server(Handshake::Role::kServer, "");
  std::string junk(transport::kHelloBytes, 'x');
  server.feed(reinterpret_cast<const uint8_t*>(junk.data()), junk.size());
  EXPECT_EQ(server.state(), Handshake::State::kFailed);
  EXPECT_NE(server.error().find("not a gradwire transport connection"), std::string::npos);
  Handshake client(Handshake::Role::kClient, "");
  std::string hello = client.take_output();
  hello[4] = 9;
  Handshake server2(Handshake::Role::kServer, "");
  server2.feed(reinterpret_cast<const uint8_t*>(hello.data()), hello.size());
  EXPECT_EQ(server2.state(), Handshake::State::kFailed);
  EXPECT_NE(server2.error().find("version 9, this worker version 2"), std::string::npos)
      << server2.error();
  // The server still says its version, so that the other end can name the mismatch too.
  const std::string back = server2.take_output();
  ASSERT_EQ(back.size(), transport::kHelloBytes);
  EXPECT_EQ(back[4], 2);
  Handshake old_client(Handshake::Role::kClient, "");
  std::string old_hello = back;
  old_hello[4] = 1;
  old_client.feed(reinterpret_cast<const uint8_t*>(old_hello.data()), old_hello.size());
  EXPECT_EQ(old_client.state(), Handshake::State::kFailed);
  EXPECT_NE(old_client.error().find("version 1, this worker version 2"), std::string::npos)
      << old_client.error();
}

}  // namespace
}  // namespace gradwire::rpc
