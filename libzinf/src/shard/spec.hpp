// What the model families' specs share (model.cpp): the "key=value,..."
// reader with its refusals, and the tensor list with its tiling, so that a
// GPT's and a Llama's spec read, refuse and tile the same way.
#pragma once

#include <zinf/shard.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace zinf::shard::detail {

// UsageError "model spec '<spec>': <why>".
[[noreturn]] void spec_error(std::string_view spec, const std::string& why);
// A positive integer, else spec_error naming key=value.
std::uint64_t spec_count(std::string_view value, std::string_view key, std::string_view spec);
// Hands each item of `items` ("k=v,k=v", the spec past its "gpt:" or
// "llama:") to `take` in order, refusing an empty item, one without '=' and
// a key given twice; returns the keys seen, in order.
std::vector<std::string_view> spec_items(std::string_view spec, std::string_view items,
                                         const std::function<void(std::string_view key, std::string_view value)>& take);

// A model's tensors in execution order, each linear weight whole or in
// `tile` pieces along its output features (tile_first, tile_name): the one
// place a tile's name, shape and place in its untiled weight are set.
class TensorList {
public:
    // How a linear weight is stored: Conv1D's (in, out), a tile its columns
    // [first, last); torch's nn.Linear (out, in), a tile its rows, which are
    // consecutive elements of the weight (seen as one row of out*in).
    enum class Layout { in_out, out_in };
    TensorList(unsigned tile, std::uint64_t count) : tile_(tile) { out_.reserve(count); }
    void plain(std::string name, std::vector<std::uint64_t> shape, InitKind init);
    void linear(const std::string& name, std::uint64_t in, std::uint64_t out, InitKind init, Layout layout);
    std::vector<Tensor> take() { return std::move(out_); }

private:
    unsigned tile_;
    std::vector<Tensor> out_;
};

}  // namespace zinf::shard::detail
