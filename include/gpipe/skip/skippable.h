// Skippable: a layer that stashes tensors for a later layer, or pops what an earlier one stashed.
// Long skip connections (U-Net, ResNet residuals flattened into a Sequential) then need no extra
// outputs threaded through every layer in between: under GPipe a stashed tensor travels from its
// partition straight to the partition that pops it, through a portal (tracker.h, portal.h).
//
// A skippable layer is a torch::nn::Module that also derives from Skippable, declares the names
// it stashes and pops, and calls stash() and pop() in its forward:
//
//   struct StashImpl : torch::nn::Module, gpipe::skip::Skippable {
//     StashImpl() : Skippable(/*stash=*/{"1to3"}, /*pop=*/{}) {}
//     torch::Tensor forward(torch::Tensor input) {
//       stash("1to3", input);
//       return input;
//     }
//   };
//   struct PopImpl : torch::nn::Module, gpipe::skip::Skippable {
//     PopImpl() : Skippable(/*stash=*/{}, /*pop=*/{"1to3"}) {}
//     torch::Tensor forward(torch::Tensor input) { return input + pop("1to3"); }
//   };
//
// Every name needs exactly one stash and one pop in a Sequential; verify_skippables() checks that
// (GPipe does when it is built). To use a name twice, isolate each pair in its own Namespace.
// Skippable layers work in a plain Sequential too: without GPipe, stash() and pop() go through the
// calling thread's own SkipTracker.
//
// Thread safety: stash() and pop() act on the calling thread's current tracker; declarations
// (isolate) must not change while the module runs.
#pragma once

#include "gpipe/skip/namespace.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace gpipe {
namespace skip {

/// The mixin that makes a module skippable. See the file comment.
class Skippable {
 public:
  virtual ~Skippable() = default;

  /// The names this layer stashes, and pops.
  const std::set<std::string>& stashable_names() const { return stashable_names_; }
  const std::set<std::string>& poppable_names() const { return poppable_names_; }

  /// `name` in the namespace it is isolated in (Namespace::none() unless isolated).
  SkipKey key(const std::string& name) const;
  /// The namespaced names this layer stashes, and pops.
  std::vector<SkipKey> stashable() const;
  std::vector<SkipKey> poppable() const;

  /// Puts every declared name into `ns`.
  void isolate(const Namespace& ns);
  /// Puts the names in `only` into `ns`. Throws c10::ValueError for a name that is neither
  /// stashable nor poppable here.
  void isolate(const Namespace& ns, const std::vector<std::string>& only);

 protected:
  /// Declares the names the layer stashes and those it pops.
  Skippable(std::vector<std::string> stash, std::vector<std::string> pop);

  /// Stashes `tensor` (may be undefined) under `name` for the layer that pops it. Throws
  /// c10::Error if `name` was not declared stashable.
  void stash(const std::string& name, at::Tensor tensor);

  /// Takes the tensor stashed under `name`. Throws c10::Error if `name` was not declared
  /// poppable, or has not been stashed.
  at::Tensor pop(const std::string& name);

 private:
  std::set<std::string> stashable_names_;
  std::set<std::string> poppable_names_;
  std::map<std::string, Namespace> namespaces_;
};

/// The Skippable side of `module`, or nullptr when it is not skippable.
const Skippable* as_skippable(const torch::nn::Module& module);
Skippable* as_skippable(torch::nn::Module& module);

namespace detail {
// isolate() below: all names when `only` is null.
void isolate_module(torch::nn::Module& module, const Namespace& ns,
                    const std::vector<std::string>* only);
}  // namespace detail

/// Isolates the names of a skippable `module` (a ModuleHolder, e.g. `Stash()`) in `ns` and
/// returns it, for use inside a Sequential's constructor. Throws c10::TypeError if the module is
/// not skippable.
///
/// Example:
///   gpipe::skip::Namespace ns1, ns2;
///   torch::nn::Sequential model(isolate(Stash(), ns1), isolate(Stash(), ns2),
///                               isolate(Pop(), ns2), isolate(Pop(), ns1));
template <typename ModuleHolder>
ModuleHolder isolate(ModuleHolder module, const Namespace& ns) {
  detail::isolate_module(*module.ptr(), ns, nullptr);
  return module;
}
template <typename ModuleHolder>
ModuleHolder isolate(ModuleHolder module, const Namespace& ns,
                     const std::vector<std::string>& only) {
  detail::isolate_module(*module.ptr(), ns, &only);
  return module;
}
/// Checks that every skip name of the layers of `module` has exactly one stash and one later pop
/// (per namespace). Throws c10::TypeError listing every problem, one line each, e.g.
/// "* '1' redeclared 'foo' as stashable but not isolated by namespace".
void verify_skippables(const torch::nn::Sequential& module);

}  // namespace skip
}  // namespace gpipe
