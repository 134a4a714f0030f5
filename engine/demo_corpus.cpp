#include "engine/demo_corpus.h"

namespace pagellm::engine {

// Plain ASCII on purpose: every merge the demo tokenizer learns then decodes to
// printable text.
std::string_view demo_corpus() {
  static constexpr std::string_view kText = R"(The Lighthouse Keeper

On the northern edge of the island there is a small white lighthouse, and in it lives a
keeper who has watched the sea for more than thirty years. Every evening, just before the
sun goes down, she climbs the 112 steps of the narrow stairway, cleans the great glass
lens, and lights the lamp. The beam turns once every ten seconds. Sailors who pass the
rocks at night count the flashes and know exactly where they are.

She keeps a journal on the table by the window. Most of the entries are short: the time
the lamp was lit, the direction of the wind, the height of the waves, the ships that went
by. "Wind from the west, strong. Rain after midnight. Two fishing boats came home late."
But some days she writes more. She writes about the birds that rest on the railing during
storms, about the seals that sleep on the flat stones below the cliff, and about the
children from the village who sometimes walk up the hill to ask her questions.

What do you do when the lamp breaks? they ask. What happens if you fall asleep? Have you
ever seen a whale? She answers every question carefully, because she remembers being a
child herself and wanting to know how the world worked.

A Short History of Bread

People have been making bread for at least fourteen thousand years. The first breads were
probably flat cakes of crushed grain and water, baked on hot stones beside a fire. Later,
someone noticed that dough left out in the warm air would rise, and that the bread made
from it was lighter and softer. This happened because wild yeast, which floats in the air
and lives on the skins of fruit, had started to feed on the sugars in the flour.

Today a simple loaf still needs only four things: flour, water, salt and yeast. The baker
mixes them, kneads the dough until it is smooth and elastic, and then lets it rest. During
the first rise the yeast produces gas, and the gluten in the flour traps it in thousands of
tiny bubbles. After shaping, the loaf rises again, and then it goes into a hot oven. The
crust turns brown because sugars and proteins react in the heat, which is also why fresh
bread smells so good.

How a Computer Remembers

A computer keeps the things it is working on in memory, and memory is divided into small
pieces of equal size called pages. When a program asks for more space, the operating system
finds free pages and gives them to it. The pages do not have to be next to each other: a
table records which page holds which part of the program's data, so the program can act as
if its memory were one long continuous line.

The same idea helps a server that answers many questions at once. Each conversation needs
a place to store what it has already read, and that store grows by one entry for every new
word. Instead of reserving a huge block for each conversation in advance, the server hands
out small blocks of 16 entries as they are needed, and takes them back as soon as a
conversation ends. When two requests begin with the same text, they can even share the
blocks that hold it, which saves both memory and time.

Notes from a Walk in the Forest

The path leaves the road near an old stone bridge and climbs slowly through the trees.
In spring the ground is covered with small blue and yellow flowers, and the air is full of
the sound of water running down from the hills. By summer the leaves are so thick that the
light under them turns green, and it is cool even on the hottest afternoon.

We walked for about three hours and saw a red fox, two deer, a woodpecker, and more
mushrooms than we could count. Near the top of the hill the trees opened, and we could see
the whole valley below us: the river, the fields, the roofs of the town, and far away the
grey line of the mountains. We sat on a fallen log, ate our sandwiches, and did not say
anything for a long time.

On the way down it started to rain. The drops were large and warm, and they made a soft
noise on the leaves above us long before we felt them. By the time we reached the bridge we
were wet through, but nobody minded.

The Market on Saturday

Every Saturday morning the square in front of the town hall fills with market stalls. The
farmers arrive before six o'clock to set up their tables, and by eight the first customers
are already walking between them with baskets and bags. There are apples and pears from the
orchards in the south, potatoes and onions, fresh eggs, honey, cheese, flowers, and bread
from the bakery on the corner. An old man sells wooden spoons that he carves himself, and a
young woman sells jars of jam in twelve different flavors.

Prices are written on small pieces of card: 2 dollars for a bunch of carrots, 5 for a dozen
eggs, 7 for a large jar of honey. People talk as much as they buy. They ask about each
other's families, complain about the weather, and share news about the school, the new road,
and the football match on Sunday.

Learning to Play the Piano

When I was nine years old my grandmother gave me her piano. It was heavy, black and slightly
out of tune, and it took four people to carry it up the stairs. I had no idea how to play it,
so every Tuesday after school I went to a teacher who lived two streets away. She was patient
and strict at the same time. We began with scales, which I found boring, and simple songs,
which I liked much more.

Progress was slow. For weeks my fingers refused to do what I wanted, and the same mistakes
came back again and again. Then, one evening in winter, I played a whole piece from start to
finish without stopping. It was not perfect, but it was music, and I was so happy that I
played it six more times before dinner.

Questions and Answers

Why is the sky blue? Sunlight is made of many colors, and when it passes through the air,
the blue part is scattered in all directions more than the red part. So when we look at any
part of the sky, we see blue light coming toward us.

Why do we have seasons? The earth is tilted. For half of the year the northern half leans
toward the sun and receives more direct light, which makes it warmer; for the other half it
leans away, and it is colder.

How far away is the moon? On average, about 384,400 kilometers. Light takes a little more
than one second to travel that distance, and the astronauts who went there needed about three
days.

What is the largest animal that has ever lived? As far as we know, it is the blue whale. An
adult can be longer than 30 meters and weigh more than 150 tonnes, yet it feeds mostly on
tiny animals called krill.

A Letter to a Friend

Dear Sam,

Thank you for your letter and for the photographs of your new house. The garden looks
wonderful, and I can see why you fell in love with the place. I hope the move was not too
tiring and that the cat has forgiven you for putting her in a box for the journey.

Things here are quiet. I have started working in the library three days a week, mostly
helping people find books and teaching older readers how to use the computers. It is calmer
than my old job, and I like it very much. In the evenings I have been reading, cooking, and
trying, without much success, to grow tomatoes on the balcony.

Please write again soon, and let me know when you would like to visit. There is always a
bed for you here, and I would love to show you the river walk and the little cafe by the
harbor that makes the best soup in the city.

With love,
Alex

Rules for Writing Clearly

Say one thing in each sentence. Prefer short words to long ones, and concrete words to
abstract ones. Put the subject and the verb close together, near the start. Cut every word
that does not do any work. Read what you have written aloud: if you run out of breath, the
sentence is too long, and if you stumble, the reader will stumble too. Above all, know what
you want to say before you begin, because no amount of polishing can rescue a thought that is
not yet clear.
)";
  return kText;
}

}  // namespace pagellm::engine
