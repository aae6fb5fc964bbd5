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

// A time unit's length in ms; 0 for a word that is not a time unit.
double unit_ms(const std::string& word) {
  const std::string w = lower(word);
  if (w == "ms") return 1;
  if (w == "us" || w == "\xc2\xb5s" || w == "\xce\xbcs") return 1e-3;  // us, micro sign, mu
  if (w == "ns") return 1e-6;
  if (w == "s" || w == "sec") return 1e3;
  return 0;
}

// The time in a cell, in ms: a leading number with its unit ("3.58 ms", "4.31 us (0.49 TB/s)",
// "**1.2**"); a bare number takes `default_ms` (0: none known, NaN). NaN for anything else.
double time_in(const std::string& cell, double default_ms) {
  std::string s;
  for (char ch : cell)
    if (ch != '*' && ch != '`') s += ch;
  s = trim(s);
  if (s.empty()) return std::nan("");
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(x)) return std::nan("");
  std::string rest = trim(std::string(end));
  std::string word;
  for (char ch : rest) {
    if (std::isspace(static_cast<unsigned char>(ch)) || ch == '(' || ch == ',' || ch == ';') break;
    word += ch;
  }
  if (word.empty()) return default_ms > 0 ? x * default_ms : std::nan("");
  const double u = unit_ms(word);
  return u > 0 ? x * u : std::nan("");
}

bool mentions(const std::string& header, std::initializer_list<const char*> words) {
  const std::string h = lower(header);
  for (const char* w : words)
    if (h.find(w) != std::string::npos) return true;
  return false;
}

// The time unit named as a word in free text or a header ("Times in ms", "ours (us)"); 0: none.
double unit_named_in(const std::string& text) {
  std::string word;
  double found = 0;
  auto flush = [&] {
    if (!found && !word.empty())
      found = unit_ms(word) == 1e3 ? 0 : unit_ms(word);  // a lone "s" is no unit
    word.clear();
  };
  for (char ch : text) {
    if (std::isalpha(static_cast<unsigned char>(ch)) || (ch & 0x80)) {
      word += ch;
    } else {
      flush();
    }
  }
  flush();
  return found;
}

// Columns holding our times: "ours ...", or a header naming a time unit; never ratios or floors.
bool is_time_column(const std::string& h) {
  if (mentions(h,
               {" vs", "vs ", "ratio", "speedup", "floor", "/", "peer", "fla", "target", "note"}))
    return false;
  return mentions(h, {"ours"}) || unit_named_in(h) > 0;
}

bool is_peer_column(const std::string& h) {
  return mentions(h, {"peer", "fla"}) && !mentions(h, {" vs", "vs ", "ratio", "speedup", "/"});
}

}  // namespace

BenchTable parse_bench_markdown(const std::string& text, const std::string& where) {
  BenchTable t;
  t.path = where;
  std::istringstream in(text);
  std::string line, heading, prose;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  std::map<std::string, int> seen;
  std::vector<std::pair<BenchEntry, std::string>> rows;  // entry, heading
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string l = trim(lines[i]);
    if (!l.empty() && l[0] == '#') {
      heading = trim(l.substr(l.find_first_not_of('#')));
      if (t.machine.empty()) t.machine = heading;  // the title usually names the device and run
    }
    if (l.empty() || l[0] != '|' || i + 1 >= lines.size() ||
        !is_separator(cells_of(lines[i + 1]))) {
      prose += l + "\n";
      continue;
    }
    const auto header = cells_of(l);
    // A bare number is a time only where the header or the text since the last table says so.
    const double context_ms = unit_named_in(prose);
    prose.clear();
    std::vector<size_t> time_cols;
    int peer_col = -1;
    for (size_t c = 1; c < header.size(); ++c) {
      if (is_time_column(header[c]))
        time_cols.push_back(c);
      else if (is_peer_column(header[c]) && peer_col < 0)
        peer_col = static_cast<int>(c);
    }
    size_t r = i + 2;
    for (; r < lines.size() && !trim(lines[r]).empty() && trim(lines[r])[0] == '|'; ++r) {
      const auto cells = cells_of(lines[r]);
      for (size_t c : time_cols) {
        if (cells.size() <= c || cells[0].empty()) continue;
        const double hdr_ms = unit_named_in(header[c]);
        BenchEntry e;
        e.name = time_cols.size() == 1 ? cells[0] : cells[0] + " / " + header[c];
        e.ms = time_in(cells[c], hdr_ms > 0 ? hdr_ms : context_ms);
        if (!(e.ms > 0)) continue;
        if (peer_col >= 0 && static_cast<int>(cells.size()) > peer_col) {
          const double peer_hdr = unit_named_in(header[static_cast<size_t>(peer_col)]);
          e.peer = header[static_cast<size_t>(peer_col)];
          e.peer_ms =
              time_in(cells[static_cast<size_t>(peer_col)], peer_hdr > 0 ? peer_hdr : context_ms);
        }
        ++seen[e.name];
        rows.emplace_back(e, heading);
      }
    }
    i = r - 1;
  }
  for (auto& [e, h] : rows) {
    if (seen[e.name] > 1 && !h.empty()) e.name = h + " / " + e.name;
    t.rows.push_back(e);
  }
  if (t.rows.empty())
    throw qed::Error(where +
                     ": no benchmark rows (rule: a pipe table whose first column names the "
                     "benchmark, with an 'ours' column or a column whose header names a time "
                     "unit, and times with a unit (3.5 ms, 4.3 us) or a unit in the header or "
                     "in the text above the table)");
  return t;
}

BenchTable parse_bench_json(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw qed::Error(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object() || j.value("schema", "") != kBenchSchema)
    throw qed::Error(where + ": schema must be \"" + std::string(kBenchSchema) + "\"");
  if (!j.contains("rows") || !j["rows"].is_array())
    throw qed::Error(where + ": needs an array \"rows\" (schema " + std::string(kBenchSchema) +
                     ")");
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

std::vector<BenchDiff> compare_bench(const BenchTable& base, const BenchTable& fresh,
                                     double margin) {
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
