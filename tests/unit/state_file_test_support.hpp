// SPDX-License-Identifier: BSD-3-Clause
// state_file_test_support.hpp — what the state file's unit tests share (test_state_file.cpp,
// test_state_folder.cpp): StateFileTest (a private temp folder, removed at teardown, with the state
// file's path, raw writes and reads of it, and a sample state of two jobs with every field set).
// Contract: nothing the fixture creates outlives its test.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "daemon/state_file.hpp"

namespace mall::test {


class StateFileTest : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/mall_state_test_XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
    }
    void TearDown() override {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
    std::string path() const { return dir_ + "/malld.state.json"; }
    void write_raw(const std::string &text) {
        std::ofstream out(path(), std::ios::trunc);
        out << text;
    }
    std::string read_raw() const {
        std::ifstream in(path());
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }

    static mall::SavedState sample() {
        mall::SavedState s;
        s.pool = "0-7";
        s.reclaimed = *mall::CpuSet::parse("6-7");
        s.policy = "equal";
        mall::SavedJob a;
        a.job.spec.id = "train-a";
        a.job.spec.uid = 1000;
        a.job.spec.min = 1;
        a.job.spec.max = 4;
        a.job.spec.weight = 2.5;
        a.job.spec.guaranteed = *mall::CpuSet::parse("0");
        a.job.spec.pids = {1234, 1240};
        a.job.order = 3;
        a.job.cpuset = *mall::CpuSet::parse("0-2");
        a.job.published = *mall::CpuSet::parse("0-1");
        a.job.generation = 7;
        a.job.pinned = *mall::CpuSet::parse("0-1");
        a.job.transitions = 7;
        a.job.ack_timeouts = 1;
        a.job.usage_cap = 3;
        a.job.threads = 1;
        a.job.published_threads = 1;
        a.job.signal_control = true;
        a.job.published_signal_control = true;
        a.job.last_ack_latency_us = 41.5;
        a.job.work_units = 1000;
        a.job.steps = 10;
        a.pids = {{1234, 99887766ull}, {1240, 99887800ull}};
        a.cgroups = {{"/sys/fs/cgroup/cpuset/slurm/uid_1000/job_7/step_0", true, "0"},
                     {"/sys/fs/cgroup/cpuset/mall/job_train-a", false, ""}};
        mall::SavedJob b;
        b.job.spec.id = "b";
        b.job.spec.min = 2;
        b.job.spec.max = 2;
        b.job.spec.pids = {42};
        b.job.order = 4;
        b.job.cpuset = *mall::CpuSet::parse("3-4");
        b.job.published = *mall::CpuSet::parse("3-4");
        b.job.generation = 1;
        b.pids = {{42, 5}};
        s.jobs = {a, b};
        return s;
    }

    std::string dir_;
};

}  // namespace mall::test
