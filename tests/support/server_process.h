#pragma once
// A `pagellm serve` child process on a free port with a tiny demo model, for integration
// tests that drive the real binary. Killed when the object goes, so that a failing test
// leaves nothing running.

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/demo_model.h"

namespace pagellm::test {

inline std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The tiny demo model, written once per test process and removed at exit.
inline const std::filesystem::path& tiny_demo_model() {
  static const std::filesystem::path dir = [] {
    auto d =
        std::filesystem::temp_directory_path() / ("pagellm_test_model_" + std::to_string(getpid()));
    engine::write_demo_model(d, engine::demo_model_preset("tiny"));
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                      ("pagellm_test_model_" + std::to_string(getpid())),
                                  ignored);
    });
    return d;
  }();
  return dir;
}

class ServerProcess {
 public:
  explicit ServerProcess(const std::vector<std::string>& extra = {},
                         const std::filesystem::path& model = tiny_demo_model()) {
    using namespace std::chrono_literals;
    log_ = std::filesystem::temp_directory_path() /
           ("pagellm_serve_" + std::to_string(getpid()) + "_" + std::to_string(++count_) + ".log");
    std::vector<std::string> args = {PAGELLM_BINARY, "serve",  "--model",
                                     model.string(), "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
      unsetenv("PAGELLM_API_KEY");       // keys come from the arguments only
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args)
        argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    // The server prints the address it bound.
    const std::regex serving(R"(on http://127\.0\.0\.1:(\d+))");
    for (auto deadline = std::chrono::steady_clock::now() + 30s;
         std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
      std::smatch m;
      const std::string text = read_text_file(log_);
      if (std::regex_search(text, m, serving)) {
        port_ = std::stoi(m[1]);
        break;
      }
      if (waitpid(pid_, &status_, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
    }
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ignored;
    std::filesystem::remove(log_, ignored);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return read_text_file(log_); }

  // A client of this server; with `bearer_key`, every request carries it.
  httplib::Client client(const std::string& bearer_key = "") const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    if (!bearer_key.empty()) c.set_default_headers({{"Authorization", "Bearer " + bearer_key}});
    return c;
  }

  // The exit code of a server that exited while starting (port() is then 0), or -1.
  int start_exit_code() const {
    return port_ == 0 && pid_ < 0 && WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
  }

  // Sends `sig` and waits up to `limit` for the exit; the exit code, or -1.
  int stop(int sig, std::chrono::seconds limit) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    for (auto deadline = std::chrono::steady_clock::now() + limit;
         std::chrono::steady_clock::now() < deadline;
         std::this_thread::sleep_for(std::chrono::milliseconds(20))) {
      if (waitpid(pid_, &status_, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
      }
    }
    return -1;
  }

 private:
  static inline int count_ = 0;
  pid_t pid_ = -1;
  int port_ = 0;
  int status_ = 0;
  std::filesystem::path log_;
};

// The value of the first /metrics line that starts with `name`, or -1.
inline double metric(httplib::Client& client, const std::string& name) {
  auto res = client.Get("/metrics");
  if (!res || res->status != 200) return -1;
  std::istringstream lines(res->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(name, 0) == 0) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

// Runs `command` through the shell with stdout and stderr in `output`; its exit code.
inline int run_command(const std::string& command, std::string& output) {
  const auto log = std::filesystem::temp_directory_path() /
                   ("pagellm_command_" + std::to_string(getpid()) + ".log");
  const int status = std::system((command + " > '" + log.string() + "' 2>&1").c_str());
  output = read_text_file(log);
  std::error_code ignored;
  std::filesystem::remove(log, ignored);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace pagellm::test
