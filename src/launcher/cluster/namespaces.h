// What a run leaves on the machine: its network namespaces (named in
// /run/netns, as `ip netns` keeps them) and its state directory
// (/run/zprun/<tag>). Their names, whether their run is alive, their removal.
// See cluster.h for the names.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace zpcluster {

constexpr const char* kNetnsDir = "/run/netns";  // where `ip netns` keeps its names
constexpr const char* kStateRoot = "/run/zprun";

bool pathExists(const std::string& path);

// The names in dir, sorted; empty if it cannot be read.
std::vector<std::string> listDir(const char* dir);

// Deletes one network namespace of ours after ending what runs inside.
bool deleteNamespace(const std::string& name, std::string* error);

// Removes a state directory: its files and directories (Open MPI's session
// directories under zprun --mpirun), then itself.
bool removeStateDir(const std::string& dir, std::string* error);

// A namespace or state directory name of a run, "zp<pid>-<hex4>[-...]": its
// tag ("zp<pid>-<hex4>") and the pid of the zprun that made it.
bool parseTag(const std::string& name, std::string* tag, pid_t* pid);

// Whether the zprun that made tag still runs: it holds the lock in the state
// directory, or without one, its pid is alive.
bool runIsAlive(const std::string& tag, pid_t pid);

}  // namespace zpcluster
