// Self-check of the AES, transpose and half-gates kernels, without Python or
// OpenSSL, for porting (the pytest suite covers them through the bindings).
//   x86-64:  g++ -std=c++17 -O2 -maes -msse4.1 -mpclmul -ffunction-sections -Wl,--gc-sections \
//              -Igarbled_core/include garbled_core/tests/kernels_check.cpp \
//              garbled_core/src/halfgates.cpp garbled_core/src/iknp.cpp -o kernels_check
//   aarch64 (cross, run under qemu-aarch64): aarch64-linux-gnu-g++ ... -march=armv8-a+crypto -static
// Exit status 0 when every check passes.
#include <cstdio>
#include <cstring>
#include "garbled_core/aes.h"
#include "garbled_core/halfgates.h"
#include "garbled_core/iknp.h"
using namespace gc;
int main() {
  // FIPS-197 C.1: key 000102..0f, plaintext 00112233..ff -> 69c4e0d86a7b0430d8cdb78070b4c55a
  uint8_t key[16], pt[16], want[16] = {0x69,0xc4,0xe0,0xd8,0x6a,0x7b,0x04,0x30,0xd8,0xcd,0xb7,0x80,0x70,0xb4,0xc5,0x5a};
  for (int i = 0; i < 16; i++) { key[i] = i; pt[i] = (uint8_t)(i * 0x11); }
  AesKey k = aes_key(load_block(key));
  block x[1] = {load_block(pt)};
  aes_encrypt_blocks<1>(k, x);
  uint8_t got[16]; store_block(got, x[0]);
  int ok = memcmp(got, want, 16) == 0;
  printf("aes %s\n", ok ? "ok" : "FAIL");
  // transpose
  uint8_t in[128][16]; for (int i=0;i<128;i++) for(int j=0;j<16;j++) in[i][j]=(uint8_t)(i*31+j*7+(i*j));
  block rows[128], out[128]; for(int i=0;i<128;i++) rows[i]=load_block(in[i]);
  transpose128(rows,1,out); int tok=1;
  for(int i=0;i<128;i++) for(int j=0;j<128;j++){ uint8_t o[16]; store_block(o,out[j]); int b1=(in[i][j>>3]>>(j&7))&1, b2=(o[i>>3]>>(i&7))&1; if(b1!=b2) tok=0; }
  printf("transpose %s\n", tok?"ok":"FAIL");
  // half-gates: garble then evaluate all four input combinations
  const int n = 37; block a0[n], b0[n], c0[n], t[2*n], c[n];
  block delta = make_block(0x1234567890abcdefull, 0xfedcba0987654321ull | 1);
  for (int i=0;i<n;i++){ a0[i]=make_block(i*977+3, i*131+7); b0[i]=make_block(i*7919+11,i*31+5);}
  block salt = make_block(42, 43);
  and_kernels().garble(a0,b0,c0,t,n,16,delta,salt,99);
  int hok=1;
  for (int va=0;va<2;va++) for(int vb=0;vb<2;vb++){
    block a[n], b[n];
    for(int i=0;i<n;i++){ a[i]=va?xor_block(a0[i],delta):a0[i]; b[i]=vb?xor_block(b0[i],delta):b0[i]; }
    and_kernels().eval(a,b,c,t,n,16,salt,99);
    for(int i=0;i<n;i++){ block want_c = (va&vb)?xor_block(c0[i],delta):c0[i]; if(!equal_block(c[i],want_c)) hok=0; }
  }
  printf("halfgates(%s) %s\n", and_kernels().name, hok?"ok":"FAIL");
  return ok && tok && hok ? 0 : 1;
}
