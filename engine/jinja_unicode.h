#pragma once
// Code-point level string helpers: Python indexes, strips and case-maps strings by code
// point, while the engine stores UTF-8.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm::engine::jinja {

std::u32string utf8_decode(std::string_view text);  // invalid bytes become U+FFFD
std::string utf8_encode(std::u32string_view text);
void utf8_append(std::string& out, char32_t c);
size_t utf8_length(std::string_view text);

bool is_python_space(char32_t c);      // str.isspace()
bool is_python_printable(char32_t c);  // str.isprintable(), used by repr()
char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);
bool is_cased(char32_t c);
bool is_lowercase(char32_t c);  // the Lowercase property, which str.islower() reads
bool is_uppercase(char32_t c);
bool is_titlecase(char32_t c);
bool is_alpha(char32_t c);
bool is_digit(char32_t c);

// Python's str.upper(), lower(), title() and capitalize(): Unicode's full case mappings
// (U+00DF to "SS", U+0130 to "i" and U+0307), and capital sigma lowercased to final sigma
// at the end of a word.
std::string str_upper(std::string_view text);
std::string str_lower(std::string_view text);
std::string str_upper(std::u32string_view text);  // of decoded text
std::string str_lower(std::u32string_view text);
std::string str_title(std::string_view text);
std::string str_capitalize(std::string_view text);

}  // namespace pagellm::engine::jinja
