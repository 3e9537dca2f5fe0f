// gpipe_launch: the launcher on its own, the same as `gpipe launch`.
#include "launcher.h"

int main(int argc, char** argv) {
  return gpipe::launcher::launch(std::vector<std::string>(argv + 1, argv + argc), "gpipe_launch");
}
