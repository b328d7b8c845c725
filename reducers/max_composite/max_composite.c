/* Maximum snow extent composite over a time span: a bagpipe reducer in plain C.
 *
 * Usage: max_composite INPUTS_DIR OUTPUTS_DIR
 *
 * bagpipe stages each reprojected MOD10A2 tile of the span as ENVI (NAME.bin + NAME.hdr,
 * one byte per pixel). Per pixel the composite keeps the highest class code seen that is
 * not fill (255): 200 snow > 100 lake ice > 50 cloud > 39 ocean > 37 lake > 25 no snow.
 * Writes max_composite.bin + max_composite.hdr and snow_days.csv (snow pixels per input).
 * Exit code 0 on success, 2 on bad input.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FILL 255
#define SNOW 200

static int header_value(const char *header, const char *key, long *value) {
    const char *at = strstr(header, key);
    if (!at) return 0;
    at = strchr(at, '=');
    return at && sscanf(at + 1, "%ld", value) == 1;
}

static int compare(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s INPUTS_DIR OUTPUTS_DIR\n", argv[0]);
        return 2;
    }
    DIR *dir = opendir(argv[1]);
    if (!dir) { perror(argv[1]); return 2; }
    char *names[4096];
    int count = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) && count < 4096) {
        size_t len = strlen(entry->d_name);
        if (len > 4 && strcmp(entry->d_name + len - 4, ".hdr") == 0) names[count++] = strdup(entry->d_name);
    }
    closedir(dir);
    if (count == 0) { fprintf(stderr, "no ENVI headers in %s\n", argv[1]); return 2; }
    qsort(names, count, sizeof names[0], compare);

    char path[4096], header[65536], first_header[65536] = "";
    long samples = 0, lines = 0;
    unsigned char *composite = NULL, *tile = NULL;
    char csv_path[4096];
    snprintf(csv_path, sizeof csv_path, "%s/snow_days.csv", argv[2]);
    FILE *csv = fopen(csv_path, "w");
    if (!csv) { perror(csv_path); return 2; }
    fprintf(csv, "input,snow_pixels,clear_pixels\n");
    for (int i = 0; i < count; i++) {
        snprintf(path, sizeof path, "%s/%s", argv[1], names[i]);
        FILE *h = fopen(path, "r");
        if (!h) { perror(path); return 2; }
        size_t got = fread(header, 1, sizeof header - 1, h);
        header[got] = 0;
        fclose(h);
        long s, l, type;
        if (!header_value(header, "samples", &s) || !header_value(header, "lines", &l) ||
            !header_value(header, "data type", &type) || type != 1) {
            fprintf(stderr, "%s: not a one-byte ENVI raster\n", names[i]);
            return 2;
        }
        if (!composite) {
            samples = s; lines = l;
            composite = malloc(samples * lines);
            tile = malloc(samples * lines);
            if (!composite || !tile) { fprintf(stderr, "out of memory\n"); return 2; }
            memset(composite, FILL, samples * lines);
            strcpy(first_header, header);
        } else if (s != samples || l != lines) {
            fprintf(stderr, "%s: %ldx%ld, the others are %ldx%ld\n", names[i], s, l, samples, lines);
            return 2;
        }
        names[i][strlen(names[i]) - 4] = 0;
        snprintf(path, sizeof path, "%s/%s.bin", argv[1], names[i]);
        FILE *b = fopen(path, "rb");
        if (!b || fread(tile, 1, samples * lines, b) != (size_t)(samples * lines)) {
            fprintf(stderr, "%s: short or missing data\n", path);
            return 2;
        }
        fclose(b);
        long snow = 0, clear = 0;
        for (long p = 0; p < samples * lines; p++) {
            unsigned char v = tile[p];
            if (v == FILL) continue;
            if (composite[p] == FILL || v > composite[p]) composite[p] = v;
            snow += v == SNOW;
            clear += v == SNOW || v == 25;
        }
        fprintf(csv, "%s,%ld,%ld\n", names[i], snow, clear);
    }
    fclose(csv);
    snprintf(path, sizeof path, "%s/max_composite.bin", argv[2]);
    FILE *out = fopen(path, "wb");
    if (!out || fwrite(composite, 1, samples * lines, out) != (size_t)(samples * lines)) { perror(path); return 2; }
    fclose(out);
    snprintf(path, sizeof path, "%s/max_composite.hdr", argv[2]);
    out = fopen(path, "w");
    if (!out) { perror(path); return 2; }
    fputs(first_header, out);  /* same grid, same map info */
    fclose(out);
    printf("%d inputs, %ldx%ld pixels\n", count, samples, lines);
    return 0;
}
