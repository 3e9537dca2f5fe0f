#include "gpipe/skip/skippable.h"

#include "gpipe/skip/tracker.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace gpipe {
namespace skip {

Skippable::Skippable(std::vector<std::string> stash, std::vector<std::string> pop)
    : stashable_names_(stash.begin(), stash.end()), poppable_names_(pop.begin(), pop.end()) {}

SkipKey Skippable::key(const std::string& name) const {
  auto ns = namespaces_.find(name);
  return {ns == namespaces_.end() ? Namespace::none() : ns->second, name};
}

std::vector<SkipKey> Skippable::stashable() const {
  std::vector<SkipKey> keys;
  for (const auto& name : stashable_names_) keys.push_back(key(name));
  return keys;
}

std::vector<SkipKey> Skippable::poppable() const {
  std::vector<SkipKey> keys;
  for (const auto& name : poppable_names_) keys.push_back(key(name));
  return keys;
}

void Skippable::isolate(const Namespace& ns) {
  for (const auto& name : stashable_names_) namespaces_[name] = ns;
  for (const auto& name : poppable_names_) namespaces_[name] = ns;
}

void Skippable::isolate(const Namespace& ns, const std::vector<std::string>& only) {
  for (const auto& name : only) {
    TORCH_CHECK_VALUE(stashable_names_.count(name) || poppable_names_.count(name),
                      "cannot isolate '", name,
                      "': it is neither stashable nor poppable in this module");
  }
  for (const auto& name : only) namespaces_[name] = ns;
}

void Skippable::stash(const std::string& name, at::Tensor tensor) {
  TORCH_CHECK(stashable_names_.count(name), "'", name, "' has not been declared as stashable");
  current_skip_tracker()->save(key(name), std::move(tensor));
}

at::Tensor Skippable::pop(const std::string& name) {
  TORCH_CHECK(poppable_names_.count(name), "'", name, "' has not been declared as poppable");
  return current_skip_tracker()->load(key(name));
}

const Skippable* as_skippable(const torch::nn::Module& module) {
  return dynamic_cast<const Skippable*>(&module);
}

Skippable* as_skippable(torch::nn::Module& module) { return dynamic_cast<Skippable*>(&module); }

namespace detail {

void isolate_module(torch::nn::Module& module, const Namespace& ns,
                    const std::vector<std::string>* only) {
  Skippable* skippable = as_skippable(module);
  TORCH_CHECK_TYPE(skippable != nullptr, "cannot isolate ", module.name(),
                   ": it is not a gpipe::skip::Skippable");
  if (only == nullptr) {
    skippable->isolate(ns);
  } else {
    skippable->isolate(ns, *only);
  }
}

}  // namespace detail

void verify_skippables(const torch::nn::Sequential& module) {
  std::set<SkipKey> stashed;
  std::set<SkipKey> popped;
  std::vector<std::string> problems;

  for (const auto& child : module->named_children()) {
    const Skippable* layer = as_skippable(*child.value());
    if (layer == nullptr) continue;
    const std::string quoted = "'" + child.key() + "'";

    for (const auto& name : layer->stashable_names()) {
      if (layer->poppable_names().count(name)) {
        problems.push_back(quoted + " declared '" + name + "' both as stashable and as poppable");
      }
    }
    for (const auto& key : layer->stashable()) {
      if (layer->poppable_names().count(key.second)) continue;
      if (!stashed.insert(key).second) {
        problems.push_back(quoted + " redeclared '" + key.second +
                           "' as stashable but not isolated by namespace");
      }
    }
    for (const auto& key : layer->poppable()) {
      if (layer->stashable_names().count(key.second)) continue;
      if (popped.count(key)) {
        problems.push_back(quoted + " redeclared '" + key.second +
                           "' as poppable but not isolated by namespace");
      } else if (!stashed.count(key)) {
        problems.push_back(quoted + " declared '" + key.second +
                           "' as poppable but it was not stashed");
      } else {
        popped.insert(key);
      }
    }
  }
  for (const auto& key : stashed) {
    if (!popped.count(key)) {
      problems.push_back("no module declared '" + key.second + "' as poppable but stashed");
    }
  }

  if (problems.empty()) return;
  std::ostringstream message;
  message << "one or more pairs of stash and pop do not match:\n";
  for (const auto& problem : problems) message << "\n* " << problem;
  TORCH_CHECK_TYPE(false, message.str());
}

}  // namespace skip
}  // namespace gpipe
