#include "gpipe/schedule/transport.h"

namespace gpipe {
namespace schedule {

// Out of line: the one place the vtable and type information of Transport live, so that every
// program and library linked with gpipe agrees on them (dynamic_cast across shared libraries).
Transport::~Transport() = default;

}  // namespace schedule
}  // namespace gpipe
