#include "verify/certify_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "reference/error.hpp"

namespace qed::verify {

namespace {

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::vector<std::string> cells_of(const std::string& line) {
  std::string s = trim(line);
  if (!s.empty() && s.front() == '|') s.erase(0, 1);
  if (!s.empty() && s.back() == '|') s.pop_back();
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (ch == '|') {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(trim(cur));
  return out;
}

bool is_separator(const std::vector<std::string>& cells) {
  for (const auto& c : cells) {
    if (c.empty()) return false;
    for (char ch : c)
      if (ch != '-' && ch != ':' && ch != ' ') return false;
  }
  return !cells.empty();
}

// Leading number of a cell ("1.23", "1.23 ms", "**1.2**"); NaN when there is none.
double number_in(const std::string& cell) {
  std::string s;
  for (char ch : cell)
    if (ch != '*' && ch != '`') s += ch;
  s = trim(s);
  if (s.empty()) return std::nan("");
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(x)) return std::nan("");
  return x;
}

bool mentions(const std::string& header, std::initializer_list<const char*> words) {
  const std::string h = lower(header);
  for (const char* w : words)
    if (h.find(w) != std::string::npos) return true;
  return false;
}

bool is_ms_header(const std::string& h) {
  const std::string l = lower(h);
  // "ms", "(ms)", "time_ms", "median ms", but not "params" or "ms/step"-free words like "forms".
  for (size_t pos = l.find("ms"); pos != std::string::npos; pos = l.find("ms", pos + 1)) {
    const bool left = pos == 0 || !std::isalpha(static_cast<unsigned char>(l[pos - 1])) || l[pos - 1] == '_';
    const bool right = pos + 2 >= l.size() || !std::isalpha(static_cast<unsigned char>(l[pos + 2]));
    if (left && right) return true;
  }
  return false;
}

}  // namespace

BenchTable parse_bench_markdown(const std::string& text, const std::string& where) {
  BenchTable t;
  t.path = where;
  std::istringstream in(text);
  std::string line, heading;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  std::map<std::string, int> seen;
  std::vector<std::pair<BenchEntry, std::string>> rows;  // entry, heading
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    const std::string l = trim(lines[i]);
    if (!l.empty() && l[0] == '#') {
      heading = trim(l.substr(l.find_first_not_of('#')));
      continue;
    }
    if (l.empty() || l[0] != '|') continue;
    const auto header = cells_of(l);
    if (!is_separator(cells_of(lines[i + 1]))) continue;
    int ms_col = -1, peer_col = -1;
    for (size_t c = 1; c < header.size(); ++c) {
      if (!is_ms_header(header[c])) continue;
      if (mentions(header[c], {"peer", "fla"})) {
        if (peer_col < 0) peer_col = static_cast<int>(c);
      } else if (!mentions(header[c], {"ratio", "speedup"}) && ms_col < 0) {
        ms_col = static_cast<int>(c);
      }
    }
    size_t r = i + 2;
    for (; r < lines.size() && !trim(lines[r]).empty() && trim(lines[r])[0] == '|'; ++r) {
      if (ms_col < 0) continue;
      const auto cells = cells_of(lines[r]);
      if (static_cast<int>(cells.size()) <= ms_col) continue;
      BenchEntry e;
      e.name = cells[0];
      e.ms = number_in(cells[static_cast<size_t>(ms_col)]);
      if (e.name.empty() || !(e.ms == e.ms)) continue;
      if (peer_col >= 0 && static_cast<int>(cells.size()) > peer_col) {
        e.peer = header[static_cast<size_t>(peer_col)];
        e.peer_ms = number_in(cells[static_cast<size_t>(peer_col)]);
      }
      ++seen[e.name];
      rows.emplace_back(e, heading);
    }
    i = r - 1;
  }
  for (auto& [e, h] : rows) {
    if (seen[e.name] > 1 && !h.empty()) e.name = h + " / " + e.name;
    t.rows.push_back(e);
  }
  if (t.rows.empty())
    throw qed::Error(where + ": no benchmark rows (rule: a pipe table whose first column names the "
                             "benchmark and one column header mentions ms)");
  return t;
}

BenchTable parse_bench_json(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw qed::Error(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object() || j.value("schema", "") != kBenchSchema)
    throw qed::Error(where + ": schema must be \"" + std::string(kBenchSchema) + "\"");
  if (!j.contains("rows") || !j["rows"].is_array())
    throw qed::Error(where + ": needs an array \"rows\" (schema " + std::string(kBenchSchema) + ")");
  BenchTable t;
  t.path = where;
  t.machine = j.value("machine", "");
  t.git_commit = j.value("git_commit", "");
  t.created = j.value("created", "");
  if (j.contains("unit") && j["unit"] != "ms") throw qed::Error(where + ": unit must be \"ms\"");
  for (size_t i = 0; i < j["rows"].size(); ++i) {
    const auto& r = j["rows"][i];
    const std::string at = fmt::format("{}: rows[{}]", where, i);
    if (!r.is_object() || !r.contains("name") || !r["name"].is_string())
      throw qed::Error(at + ": needs a string \"name\"");
    if (!r.contains("ms") || !r["ms"].is_number() || !(r["ms"].get<double>() > 0))
      throw qed::Error(at + ": needs \"ms\", a number > 0");
    BenchEntry e;
    e.name = r["name"].get<std::string>();
    e.ms = r["ms"].get<double>();
    e.peer = r.value("peer", "");
    if (r.contains("peer_ms") && r["peer_ms"].is_number()) e.peer_ms = r["peer_ms"].get<double>();
    for (const auto& other : t.rows)
      if (other.name == e.name) throw qed::Error(at + ": name '" + e.name + "' appears twice");
    t.rows.push_back(e);
  }
  return t;
}

BenchTable read_bench_table(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw qed::Error(path + ": cannot open benchmark table");
  std::stringstream ss;
  ss << f.rdbuf();
  const bool md = path.size() >= 3 && lower(path.substr(path.size() - 3)) == ".md";
  return md ? parse_bench_markdown(ss.str(), path) : parse_bench_json(ss.str(), path);
}

std::vector<BenchDiff> compare_bench(const BenchTable& base, const BenchTable& fresh, double margin) {
  std::vector<BenchDiff> out;
  for (const auto& b : base.rows) {
    BenchDiff d;
    d.name = b.name;
    d.baseline_ms = b.ms;
    auto it = std::find_if(fresh.rows.begin(), fresh.rows.end(),
                           [&](const BenchEntry& e) { return e.name == b.name; });
    if (it == fresh.rows.end()) {
      d.status = "missing";  // a benchmark that disappeared is reported, not failed
      d.fresh_ms = std::nan("");
      d.ratio = std::nan("");
    } else {
      d.fresh_ms = it->ms;
      d.ratio = it->ms / b.ms;
      d.pass = it->ms <= b.ms * (1 + margin);
      d.status = d.pass ? "ok" : "slower";
    }
    out.push_back(d);
  }
  for (const auto& f : fresh.rows)
    if (std::none_of(base.rows.begin(), base.rows.end(),
                     [&](const BenchEntry& e) { return e.name == f.name; }))
      out.push_back({f.name, std::nan(""), f.ms, std::nan(""), "new", true});
  return out;
}

}  // namespace qed::verify
