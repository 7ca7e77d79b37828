/* The questions below were written for DwarfStar's evaluator; none is taken
 * from a published benchmark. Keys of the MATH and CODE items were checked
 * by running the computation (python3, gcc); `source` names the rule. */
#include "quality/eval_questions.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MC(t, a, b, c, d, k, s) {0, DS4_EVAL_MC, t, {a, b, c, d}, k, s}
#define MATH(t, k, s) {0, DS4_EVAL_MATH, t, {0}, k, s}
#define CODE(t, k, s) {0, DS4_EVAL_CODE, t, {0}, k, s}
#define SEC(t, k, s) {0, DS4_EVAL_SEC, t, {0}, k, s}

static const ds4_eval_question MC_ITEMS[] = {
    MC("Which gas makes up the largest fraction of Earth's dry atmosphere by volume?",
       "Oxygen", "Nitrogen", "Argon", "Carbon dioxide", "B", "dry air is about 78% N2, 21% O2, 0.9% Ar"),
    MC("A stone is dropped from rest. Ignoring air resistance and taking g = 10 m/s^2, how far does it fall in the first 2 seconds?",
       "10 m", "40 m", "20 m", "5 m", "C", "d = g t^2 / 2 = 10 * 4 / 2 = 20 m"),
    MC("What is the pH of a 0.001 M solution of HCl at 25 degrees C (a strong acid, fully dissociated)?",
       "1", "2", "11", "3", "D", "[H+] = 1e-3, pH = -log10(1e-3) = 3"),
    MC("In eukaryotic cells, where does oxidative phosphorylation take place?",
       "Inner mitochondrial membrane", "Ribosome", "Golgi apparatus", "Lysosome", "A", "the electron transport chain and ATP synthase sit in the inner mitochondrial membrane"),
    MC("All bloops are razzies and all razzies are lazzies. Which statement must be true?",
       "All lazzies are bloops", "Some razzies are not bloops", "No lazzies are bloops", "All bloops are lazzies", "D", "subset relation is transitive: bloops in razzies in lazzies"),
    MC("What is the equivalent resistance of a 6 ohm and a 3 ohm resistor connected in parallel?",
       "2 ohm", "9 ohm", "4.5 ohm", "18 ohm", "A", "1/R = 1/6 + 1/3 = 1/2, R = 2"),
    MC("Which element has the highest electronegativity on the Pauling scale?",
       "Oxygen", "Chlorine", "Nitrogen", "Fluorine", "D", "fluorine, 3.98, is the most electronegative element"),
    MC("The energy of a photon is doubled. What happens to its wavelength?",
       "It doubles", "It is halved", "It is unchanged", "It is multiplied by four", "B", "E = hc / lambda, so lambda is inversely proportional to E"),
    MC("Two heterozygous parents (Aa x Aa) have offspring. What fraction of the offspring is expected to be homozygous recessive (aa)?",
       "1/2", "3/4", "1/4", "1/8", "C", "Punnett square: AA, Aa, aA, aa; one of four"),
    MC("How many moles of water are in 36 g of water? (molar mass 18 g/mol)",
       "0.5", "2", "1", "18", "B", "n = m / M = 36 / 18 = 2"),
    MC("In a perfectly inelastic collision between two bodies with no external forces, which quantity is conserved?",
       "Kinetic energy only", "Both momentum and kinetic energy", "Momentum only", "Neither", "C", "momentum is always conserved without external forces; kinetic energy is lost when the bodies stick"),
    MC("What number comes next in the sequence 2, 6, 12, 20, 30, ...?",
       "40", "42", "44", "36", "B", "the terms are n(n+1): 6 * 7 = 42"),
    MC("An ideal gas is held at constant volume while its absolute temperature doubles. What happens to its pressure?",
       "It doubles", "It is halved", "It is unchanged", "It is multiplied by four", "A", "P V = n R T with V fixed: P is proportional to T"),
    MC("Which of these numbers is NOT prime?",
       "97", "89", "83", "91", "D", "91 = 7 * 13"),
    MC("In DNA, adenine pairs with which base?",
       "Cytosine", "Thymine", "Guanine", "Uracil", "B", "Watson-Crick pairs: A-T and G-C (uracil replaces thymine in RNA)"),
    MC("A radioactive isotope has a half-life of 5 days. What fraction of a sample remains after 15 days?",
       "1/3", "1/6", "1/8", "1/16", "C", "15 days = 3 half-lives, (1/2)^3 = 1/8"),
    MC("Five people stand in a row. Eve is at the left end. Ann is somewhere left of Ben, Ben is somewhere left of Cal, and Dee is somewhere right of Cal. Who stands in the middle position?",
       "Ann", "Cal", "Dee", "Ben", "D", "Eve takes position 1; Ann < Ben < Cal < Dee fill 2..5 in order, so Ben is third"),
    MC("Which of these is a vector quantity?",
       "Displacement", "Mass", "Temperature", "Energy", "A", "displacement has magnitude and direction; the others are scalars"),
    MC("What is the oxidation state of manganese in potassium permanganate, KMnO4?",
       "+2", "+4", "+6", "+7", "D", "K is +1, four O are -8, so Mn = +7"),
    MC("A wave has frequency 50 Hz and wavelength 4 m. What is its speed?",
       "12.5 m/s", "54 m/s", "200 m/s", "46 m/s", "C", "v = f * lambda = 50 * 4 = 200 m/s"),
    MC("Which blood vessels carry blood away from the heart?",
       "Veins", "Arteries", "Venules", "Lymph vessels", "B", "arteries carry blood away from the heart, veins toward it"),
    MC("If it rains, the street gets wet. The street is not wet. What follows?",
       "It rained", "The sun dried the street", "It did not rain", "Nothing can be concluded", "C", "modus tollens: from P -> Q and not Q, not P"),
    MC("What is the empirical formula of glucose, C6H12O6?",
       "CH2O", "C6H12O6", "CHO", "C2H4O2", "A", "divide the subscripts 6:12:6 by their gcd 6"),
    MC("A 2 kg mass hangs on a spring with constant 8 N/m. What is the angular frequency of its oscillation?",
       "4 rad/s", "16 rad/s", "0.5 rad/s", "2 rad/s", "D", "omega = sqrt(k / m) = sqrt(8 / 2) = 2 rad/s"),
    MC("Which process moves water across a semi-permeable membrane toward the side with the higher solute concentration?",
       "Active transport", "Osmosis", "Endocytosis", "Facilitated diffusion of the solute", "B", "osmosis is the passive movement of solvent toward higher solute concentration"),
    MC("A fair six-sided die is rolled twice. What is the probability that the two results sum to 7?",
       "1/6", "1/12", "7/36", "1/36", "A", "six of the 36 ordered pairs sum to 7"),
    MC("What is the strongest intermolecular force between molecules in liquid water?",
       "London dispersion", "Dipole-induced dipole", "Ionic bonding", "Hydrogen bonding", "D", "water molecules hydrogen-bond through O-H...O; ionic bonds are not intermolecular forces here"),
    MC("A ball is thrown straight up. Ignoring air resistance, what is its acceleration at the highest point?",
       "Zero", "g, directed upward", "g, directed downward", "It depends on the launch speed", "C", "gravity acts throughout the flight; only the velocity is zero at the top"),
    MC("A clock shows exactly 3:00. What is the smaller angle between the hour and minute hands?",
       "45 degrees", "90 degrees", "120 degrees", "180 degrees", "B", "each hour mark is 30 degrees; 3 marks = 90"),
    MC("Which element has atomic number 6?",
       "Nitrogen", "Boron", "Carbon", "Oxygen", "C", "carbon has six protons"),
};

static const ds4_eval_question MATH_ITEMS[] = {
    MATH("Compute 17 * 23.", "391", "17 * 23 = 391"),
    MATH("What is the sum of the integers from 1 to 100 inclusive?", "5050", "n(n+1)/2 = 100 * 101 / 2"),
    MATH("How many positive divisors does 360 have?", "24", "360 = 2^3 * 3^2 * 5, (3+1)(2+1)(1+1) = 24"),
    MATH("What is the remainder when 2^10 is divided by 7?", "2", "1024 = 7 * 146 + 2"),
    MATH("In how many ways can 3 people be chosen from a group of 10?", "120", "C(10,3) = 120"),
    MATH("Solve for x: 3x + 7 = 25.", "6", "3x = 18"),
    MATH("What is the greatest common divisor of 84 and 126?", "42", "84 = 2 * 42, 126 = 3 * 42, gcd(2,3) = 1"),
    MATH("What is the least common multiple of 12 and 18?", "36", "12 * 18 / gcd(12,18) = 216 / 6"),
    MATH("What is the sum of the interior angles of a hexagon, in degrees?", "720", "(n - 2) * 180 with n = 6"),
    MATH("Compute 7^4.", "2401", "49 * 49 = 2401"),
    MATH("How many trailing zeros does 100! have?", "24", "floor(100/5) + floor(100/25) = 20 + 4"),
    MATH("What is the area of a triangle with side lengths 3, 4 and 5?", "6", "right triangle with legs 3 and 4: 3 * 4 / 2"),
    MATH("What is the smallest positive integer n such that n! is greater than 1000?", "7", "6! = 720, 7! = 5040"),
    MATH("What is the larger root of x^2 - 5x + 6 = 0?", "3", "(x - 2)(x - 3) = 0"),
    MATH("What is the sum of the first 10 positive odd numbers?", "100", "the sum of the first n odd numbers is n^2"),
    MATH("Compute 2^0 + 2^1 + 2^2 + ... + 2^9.", "1023", "geometric series 2^10 - 1"),
    MATH("How many diagonals does a convex decagon (10 sides) have?", "35", "n(n - 3)/2 = 10 * 7 / 2"),
    MATH("With F(1) = F(2) = 1 and F(n) = F(n-1) + F(n-2), what is F(15)?", "610", "1 1 2 3 5 8 13 21 34 55 89 144 233 377 610"),
    MATH("How many integers from 1 to 1000 inclusive are divisible by 3 or by 5?", "467", "inclusion-exclusion: 333 + 200 - 66"),
    MATH("Two fair coins are tossed. What is the probability that both show heads? Give a decimal.", "0.25", "(1/2)^2"),
    MATH("Compute 1/2 + 1/3 + 1/6.", "1", "3/6 + 2/6 + 1/6"),
    MATH("A right triangle has legs 20 and 21. How long is its hypotenuse?", "29", "400 + 441 = 841 = 29^2"),
    MATH("How many distinct arrangements of the letters of the word LEVEL are there?", "30", "5! / (2! * 2!) = 120 / 4"),
    MATH("What is the square root of 2025?", "45", "45^2 = 2025"),
    MATH("What is the sum of the decimal digits of 2^15?", "26", "2^15 = 32768, 3+2+7+6+8"),
    MATH("What is the mean of 4, 8, 15, 16, 23 and 42?", "18", "sum 108 over 6 values"),
};

static const ds4_eval_question CODE_ITEMS[] = {
    CODE("print(sum(range(5)))", "10", "python3: 0+1+2+3+4"),
    CODE("x = [1, 2, 3]\ny = x\ny.append(4)\nprint(len(x))", "4", "python3: y aliases the same list"),
    CODE("print(\"abc\"[::-1])", "cba", "python3: a step of -1 reverses the string"),
    CODE("print(7 // 2, 7 % 2)", "3 1", "python3: floor division and remainder, printed with one space"),
    CODE("print(2 ** 3 ** 2)", "512", "python3: ** is right-associative, 2 ** 9"),
    CODE("d = {}\nfor c in \"banana\":\n    d[c] = d.get(c, 0) + 1\nprint(d[\"a\"])", "3", "python3: 'banana' has three a's"),
    CODE("print(len(set([1, 1, 2, 3, 3, 3])))", "3", "python3: the set is {1, 2, 3}"),
    CODE("def f(n):\n    return 1 if n <= 1 else n * f(n - 1)\nprint(f(5))", "120", "python3: 5!"),
    CODE("print([i * i for i in range(4)])", "[0, 1, 4, 9]", "python3: list repr with ', ' separators"),
    CODE("s = 0\nfor i in range(1, 10, 3):\n    s += i\nprint(s)", "12", "python3: 1 + 4 + 7"),
    CODE("print(\"-\".join(sorted(\"dcab\")))", "a-b-c-d", "python3: sorted characters joined by '-'"),
    CODE("print(int(\"101\", 2))", "5", "python3: binary 101"),
    CODE("a, b = 0, 1\nfor _ in range(10):\n    a, b = b, a + b\nprint(a)", "55", "python3: the 10th Fibonacci number"),
    CODE("print(10 / 4)", "2.5", "python3: / is true division"),
    CODE("print(bool([]), bool([0]))", "False True", "python3: an empty list is falsy, a non-empty one truthy"),
    CODE("x = 5\ndef g():\n    x = 10\n    return x\ng()\nprint(x)", "5", "python3: the assignment in g binds a local"),
    CODE("print(\"Hello\"[1:4])", "ell", "python3: slice of indexes 1..3"),
    CODE("print(list(zip([1, 2, 3], \"ab\")))", "[(1, 'a'), (2, 'b')]", "python3: zip stops at the shorter input"),
    CODE("#include <stdio.h>\nint main(void) {\n    unsigned char c = 250;\n    c += 10;\n    printf(\"%d\\n\", c);\n    return 0;\n}", "4",
         "C: unsigned char arithmetic wraps modulo 256, 260 - 256"),
    CODE("#include <stdio.h>\nint main(void) {\n    int a[5] = {1, 2, 3};\n    printf(\"%d\\n\", a[4]);\n    return 0;\n}", "0",
         "C11 6.7.9p21: members without an initializer are zero-initialized"),
    CODE("#include <stdio.h>\n#include <stdint.h>\nint main(void) {\n    printf(\"%d\\n\", (int)sizeof(int32_t) * 3);\n    return 0;\n}", "12",
         "C: int32_t is exactly 4 bytes"),
    CODE("#include <stdio.h>\nint main(void) {\n    int s = 0;\n    for (int i = 0; i < 10; i++) {\n        if (i % 3 == 0) continue;\n        s += i;\n    }\n    printf(\"%d\\n\", s);\n    return 0;\n}", "27",
         "C: 45 minus the multiples of three 0, 3, 6, 9 (18)"),
    CODE("#include <stdio.h>\nint main(void) {\n    printf(\"%d\\n\", 17 >> 2 ^ 1);\n    return 0;\n}", "5",
         "C: >> binds tighter than ^, (17 >> 2) ^ 1 = 4 ^ 1"),
    CODE("#include <stdio.h>\nint main(void) {\n    int x = -7 / 2;\n    printf(\"%d\\n\", x);\n    return 0;\n}", "-3",
         "C99 and later: integer division truncates toward zero"),
};

static const ds4_eval_question SEC_ITEMS[] = {
    SEC("int greet(const char *name) {\n    char buf[32];\n    strcpy(buf, \"Hello, \");\n    strcat(buf, name);\n    return puts(buf);\n}",
        "4", "strcat appends a caller-controlled string of any length to a 32-byte stack buffer"),
    SEC("/* a points to n ints */\nvoid clear(int *a, int n) {\n    for (int i = 0; i <= n; i++)\n        a[i] = 0;\n}",
        "3", "i <= n writes a[n], one past the end"),
    SEC("void log_msg(const char *user) {\n    char line[128];\n    snprintf(line, sizeof line, \"%s\", user);\n    printf(line);\n}",
        "4", "user text used as a format string"),
    SEC("void drop(struct node *n) {\n    free(n->name);\n    free(n);\n    if (n->refs)\n        log_refs(n->refs);\n}",
        "4", "n is read after free(n)"),
    SEC("int *make_table(size_t count) {\n    int *t = malloc(count * sizeof(int));\n    if (!t)\n        return NULL;\n    for (size_t i = 0; i < count; i++)\n        t[i] = -1;\n    return t;\n}",
        "2", "count * sizeof(int) can wrap, allocating less than the loop writes"),
    SEC("size_t copy_prefix(char *dst, size_t dstlen, const char *src) {\n    size_t n = strlen(src);\n    if (dstlen == 0)\n        return 0;\n    if (n >= dstlen)\n        n = dstlen - 1;\n    memcpy(dst, src, n);\n    dst[n] = '\\0';\n    return n;\n}",
        "0", "safe: n is clamped to dstlen - 1 and the terminator fits"),
    SEC("int read_field(int fd, char *out, int outlen) {\n    int len;\n    if (read(fd, &len, sizeof len) != sizeof len)\n        return -1;\n    if (len > outlen)\n        return -1;\n    return read(fd, out, len);\n}",
        "5", "a negative len passes the upper-bound check and becomes a huge size_t in read"),
    SEC("int show_file(const char *name) {\n    char cmd[256];\n    if (strlen(name) > 200)\n        return -1;\n    snprintf(cmd, sizeof cmd, \"cat %s\", name);\n    return system(cmd);\n}",
        "5,6", "the name reaches a shell unquoted (built on 5, run on 6: one flaw)"),
    SEC("FILE *open_upload(const char *name) {\n    char path[512];\n    if (strlen(name) > 255 || strstr(name, \"..\"))\n        return NULL;\n    snprintf(path, sizeof path, \"/srv/uploads/%s\", name);\n    return fopen(path, \"rb\");\n}",
        "0", "safe: no '..' component can leave the fixed prefix, and the path fits in 512 bytes"),
    SEC("static const char *names[4] = {\"zero\", \"one\", \"two\", \"three\"};\nconst char *digit_name(int d) {\n    if (d > 3)\n        return \"?\";\n    return names[d];\n}",
        "3", "no lower bound: a negative d indexes before the array"),
    SEC("int sum_positive(const int *v, int n) {\n    int total;\n    for (int i = 0; i < n; i++)\n        if (v[i] > 0)\n            total += v[i];\n    return total;\n}",
        "2", "total is never initialized; its stack garbage is returned"),
    SEC("struct pkt { uint16_t len; uint8_t data[]; };\nvoid handle(const struct pkt *p, size_t pktlen) {\n    uint8_t body[64];\n    if (pktlen < sizeof *p)\n        return;\n    memcpy(body, p->data, p->len);\n    consume(body, p->len);\n}",
        "6", "p->len is trusted: it is checked against neither the 64-byte buffer nor pktlen"),
    SEC("void format_id(char *out, size_t outlen, unsigned id) {\n    if (outlen == 0)\n        return;\n    int n = snprintf(out, outlen, \"id-%u\", id);\n    if (n < 0)\n        out[0] = '\\0';\n}",
        "0", "safe: snprintf is bounded by outlen, which is non-zero"),
    SEC("char *dup_str(const char *s) {\n    size_t n = strlen(s);\n    char *d = malloc(n);\n    if (!d)\n        return NULL;\n    memcpy(d, s, n + 1);\n    return d;\n}",
        "3,6", "the allocation misses the terminator's byte (3) that the copy writes (6)"),
    SEC("int get_item(const int *items, size_t count, int idx) {\n    if (idx >= (int)count)\n        return -1;\n    return items[idx];\n}",
        "2", "a negative idx passes the check and reads before the array"),
    SEC("unsigned bucket_of(const char *key, unsigned nbuckets) {\n    unsigned h = 5381;\n    if (nbuckets == 0)\n        return 0;\n    for (; *key; key++)\n        h = h * 33 + (unsigned char)*key;\n    return h % nbuckets;\n}",
        "0", "safe: unsigned wraparound is defined and the modulus is checked non-zero"),
    SEC("int ask_name(void) {\n    char name[40];\n    printf(\"name? \");\n    if (!gets(name))\n        return -1;\n    return greet(name);\n}",
        "4", "gets cannot bound its input"),
    SEC("void *read_blob(FILE *f, uint64_t size) {\n    uint32_t n = (uint32_t)size;\n    uint8_t *buf = malloc(n);\n    if (!buf)\n        return NULL;\n    if (fread(buf, 1, size, f) != size) {\n        free(buf);\n        return NULL;\n    }\n    return buf;\n}",
        "2", "the 64-bit size is truncated to 32 bits, so the buffer can be smaller than what fread writes"),
};

#define COUNT(a) ((int)(sizeof(a) / sizeof(a)[0]))
#define N_TOTAL (COUNT(MC_ITEMS) + COUNT(MATH_ITEMS) + COUNT(CODE_ITEMS) + COUNT(SEC_ITEMS))

static ds4_eval_question g_table[N_TOTAL];
static int g_n;

/* Round robin over the categories, each in its written order: ids depend
 * only on the tables above. */
static void build(void) {
    const ds4_eval_question *src[] = {MC_ITEMS, MATH_ITEMS, CODE_ITEMS, SEC_ITEMS};
    int len[] = {COUNT(MC_ITEMS), COUNT(MATH_ITEMS), COUNT(CODE_ITEMS), COUNT(SEC_ITEMS)};
    int next[4] = {0};
    while (g_n < N_TOTAL)
        for (int c = 0; c < 4; c++)
            if (next[c] < len[c]) {
                g_table[g_n] = src[c][next[c]++];
                g_table[g_n].id = g_n + 1;
                g_n++;
            }
}

const ds4_eval_question *ds4_eval_questions(int *n) {
    if (!g_n) build();
    *n = g_n;
    return g_table;
}

const ds4_eval_question *ds4_eval_question_by_id(int id) {
    int n;
    const ds4_eval_question *q = ds4_eval_questions(&n);
    return id >= 1 && id <= n ? &q[id - 1] : NULL;
}

const char *ds4_eval_category_name(ds4_eval_category c) {
    static const char *names[] = {"mc", "math", "code", "sec"};
    return (unsigned)c < DS4_EVAL_N_CATEGORIES ? names[c] : "?";
}

void ds4_eval_prompt(const ds4_eval_question *q, ds4_buf *out) {
    switch (q->cat) {
    case DS4_EVAL_MC:
        ds4_buf_puts(out, q->text);
        ds4_buf_puts(out, "\n\n");
        for (int i = 0; i < 4; i++) {
            char head[8];
            snprintf(head, sizeof head, "%c) ", 'A' + i);
            ds4_buf_puts(out, head);
            ds4_buf_puts(out, q->options[i]);
            ds4_buf_putc(out, '\n');
        }
        ds4_buf_puts(out, "\nChoose the single best option. End your reply with a line of the form \"Answer: X\" where X is A, B, C or D.");
        break;
    case DS4_EVAL_MATH:
        ds4_buf_puts(out, q->text);
        ds4_buf_puts(out, "\n\nEnd your reply with a line of the form \"Answer: N\" where N is the final number.");
        break;
    case DS4_EVAL_CODE:
        ds4_buf_puts(out, strstr(q->text, "#include") ? "What does this C program print?\n\n```c\n"
                                                        : "What does this Python 3 program print?\n\n```python\n");
        ds4_buf_puts(out, q->text);
        ds4_buf_puts(out, "\n```\n\nEnd your reply with a line of the form \"Answer: OUTPUT\" giving the exact printed text.");
        break;
    case DS4_EVAL_SEC: {
        ds4_buf_puts(out, "The following C function is shown with line numbers. Which line introduces a memory-safety or "
                          "security flaw? Give the single best line number, or 0 if the function is safe.\n\n");
        int line = 1;
        for (const char *p = q->text; *p; line++) {
            const char *nl = strchr(p, '\n');
            size_t n = nl ? (size_t)(nl - p) : strlen(p);
            char head[16];
            snprintf(head, sizeof head, "%2d  ", line);
            ds4_buf_puts(out, head);
            ds4_buf_put(out, p, n);
            ds4_buf_putc(out, '\n');
            p += n + (nl != NULL);
        }
        ds4_buf_puts(out, "\nEnd your reply with a line of the form \"Answer: N\" where N is the line number.");
        break;
    }
    default: break;
    }
}

static bool select_word(const char *w, size_t len, bool *mask, int n, char *err, size_t errlen) {
    for (int c = 0; c < DS4_EVAL_N_CATEGORIES; c++) {
        const char *name = ds4_eval_category_name((ds4_eval_category)c);
        if (strlen(name) == len && !strncmp(w, name, len)) {
            for (int i = 0; i < n; i++)
                if (g_table[i].cat == (ds4_eval_category)c) mask[i] = true;
            return true;
        }
    }
    /* an id "7" (a leading 'q' is allowed, as the report prints them) or a range "3-9" */
    char tmp[32];
    if (len >= sizeof tmp) { snprintf(err, errlen, "bad question selection '%.*s'", (int)(len > 40 ? 40 : len), w); return false; }
    memcpy(tmp, w, len);
    tmp[len] = 0;
    long lo, hi;
    char *p = tmp, *end;
    if (*p == 'q') p++;
    if (!isdigit((unsigned char)*p)) goto bad;
    lo = strtol(p, &end, 10);
    hi = lo;
    if (*end == '-') {
        p = end + 1;
        if (*p == 'q') p++;
        if (!isdigit((unsigned char)*p)) goto bad;
        hi = strtol(p, &end, 10);
    }
    if (*end) goto bad;
    if (lo < 1 || hi > n || lo > hi) {
        snprintf(err, errlen, "question selection '%s' is outside 1-%d or inverted", tmp, n);
        return false;
    }
    for (long i = lo; i <= hi; i++) mask[i - 1] = true;
    return true;
bad:
    snprintf(err, errlen, "bad question selection '%s' (ids, ranges like 3-9, or mc, math, code, sec)", tmp);
    return false;
}

bool ds4_eval_select(const char *spec, bool *mask, int n, char *err, size_t errlen) {
    int total;
    ds4_eval_questions(&total);
    if (n > total) n = total;
    memset(mask, 0, (size_t)n * sizeof *mask);
    const char *p = spec;
    bool any = false;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0) { snprintf(err, errlen, "empty item in question selection '%s'", spec); return false; }
        if (!select_word(p, len, mask, n, err, errlen)) return false;
        any = true;
        p += len + (comma != NULL);
        if (comma && !*p) { snprintf(err, errlen, "empty item in question selection '%s'", spec); return false; }
    }
    if (!any) { snprintf(err, errlen, "empty question selection"); return false; }
    return true;
}
