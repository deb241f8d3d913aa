#include <cstdio>
int main() { std::puts("geist"); return 0; }
