// Files of a certificate: atomic writes, the resumable journal, and where it was measured.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include "reference/error.hpp"
#include "verify/certificate.hpp"

namespace qed::verify {

namespace {

std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string read_all(const std::string& path, bool& exists) {
  std::ifstream f(path, std::ios::binary);
  exists = static_cast<bool>(f);
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string trim_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  return s.substr(i);
}

// The standard output of a shell command, and whether it exited with 0.
bool command_output(const char* cmd, std::string& out) {
  out.clear();
  std::FILE* p = ::popen(cmd, "r");
  if (!p) return false;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  return ::pclose(p) == 0;
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw qed::Error(
        fmt::format("{}: cannot create temporary file {} ({})", path, tmp, std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw qed::Error(fmt::format("{}: write failed ({})", tmp, std::strerror(e)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw qed::Error(fmt::format("{}: fsync/close failed ({})", tmp, std::strerror(e)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw qed::Error(fmt::format("{}: rename from {} failed ({})", path, tmp, std::strerror(e)));
  }
  // The rename itself is durable once the folder is synced.
  const int dfd = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

namespace {
// The refusal of require_same_kernels and journal_read: `where` (a file, or file:line) was
// measured by the kernels `recorded`, not by this binary's `current`.
std::string other_kernels(const std::string& where, const std::string& recorded,
                          const std::string& current, const char* to_move) {
  return fmt::format(
      "{}: kernel_fingerprint {} is not this binary's {}; resuming would mix cells of two kernels "
      "in one certificate: certify into another --out folder, or move {} away",
      where, recorded, current, to_move);
}
}  // namespace

void require_same_kernels(const std::string& certificate_path, const std::string& recorded,
                          const std::string& current) {
  if (recorded.empty() || current.empty() || recorded == current) return;
  const std::string measured_by = recorded + " (the kernels that measured its cells)";
  throw qed::Error(
      other_kernels(certificate_path, measured_by, current, "this certificate and its journal"));
}

std::string journal_path(const std::string& certificate_path) {
  const std::string ext = ".json";
  if (certificate_path.size() > ext.size() &&
      certificate_path.compare(certificate_path.size() - ext.size(), ext.size(), ext) == 0)
    return certificate_path.substr(0, certificate_path.size() - ext.size()) + ".journal.jsonl";
  return certificate_path + ".journal.jsonl";
}

void journal_append(const std::string& path, const Subject& subject, const CellResult& cell,
                    const std::string& kernel_fingerprint) {
  bool exists = false;
  std::string text = read_all(path, exists);
  if (!text.empty() && text.back() != '\n') text += '\n';
  nlohmann::json line = {
      {"schema", kJournalSchema}, {"subject", subject.name()}, {"cell", cell_to_json(cell)}};
  if (!kernel_fingerprint.empty()) line["kernel_fingerprint"] = kernel_fingerprint;
  text += line.dump() + '\n';
  write_file_atomic(path, text);
}

std::vector<CellResult> journal_read(const std::string& path, const Subject& subject, int* skipped,
                                     const std::string& kernel_fingerprint) {
  bool exists = false;
  const std::string text = read_all(path, exists);
  std::vector<CellResult> cells;
  int bad = 0;
  std::string foreign;  // the first line of other (or unknown) kernels, thrown after the loop
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    line = trim_line(line);
    if (line.empty()) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      if (!j.is_object() || j.value("schema", "") != kJournalSchema ||
          j.value("subject", "") != subject.name() || !j.contains("cell")) {
        ++bad;
        continue;
      }
      if (!kernel_fingerprint.empty()) {
        const std::string recorded = j.value("kernel_fingerprint", "");
        if (recorded != kernel_fingerprint) {
          foreign = other_kernels(
              fmt::format("{}:{}", path, lineno),
              recorded.empty() ? "none recorded (a line of unknown kernels)" : recorded,
              kernel_fingerprint, "this journal and its certificate");
          break;
        }
      }
      CellResult c = cell_from_json(j["cell"], fmt::format("{}:{}", path, lineno));
      // A later line for the same cell (a re-measurement) replaces the earlier one.
      bool replaced = false;
      for (auto& old : cells)
        if (old.spec.key() == c.spec.key()) {
          old = c;
          replaced = true;
        }
      if (!replaced) cells.push_back(std::move(c));
    } catch (const std::exception&) {
      ++bad;
    }
  }
  if (!foreign.empty()) throw qed::Error(foreign);
  if (skipped) *skipped = bad;
  return cells;
}

Machine this_machine() {
  Machine m;
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) == 0) m.hostname = host;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) m.cpu = trim_line(line.substr(colon + 1));
      break;
    }
  }
  if (m.cpu.empty()) m.cpu = "unknown";
  m.cores = static_cast<int>(std::thread::hardware_concurrency());
  return m;
}

std::string git_commit_or_unknown() {
  std::string out;
  const bool ok = command_output("git rev-parse HEAD 2>/dev/null", out);
  out = trim_line(out);
  if (!ok || out.size() != 40) return "unknown";
  return out;
}

std::string git_tree_state() {
  std::string out;
  if (!command_output("git status --porcelain --untracked-files=no 2>/dev/null", out)) return "unknown";
  return out.empty() ? "clean" : "modified";
}

std::string utc_now_iso() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace qed::verify
