// zinf-shard inspect: what a manifest holds, as a table or one JSON record.
#pragma once

#include <zinf/shard.hpp>

#include <iosfwd>

namespace zinf::shard {

json::Json inspect_json(const Manifest& m);
// Data rows carry no '#'; header and footer lines do.
void print_inspect(std::ostream& out, const Manifest& m);

}  // namespace zinf::shard
